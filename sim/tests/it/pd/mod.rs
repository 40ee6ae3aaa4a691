//! Disaggregated prefill/decode: a prefill and a decode engine of each
//! flavour, driven the way each engine's reference proxy drives them
//! (vLLM's toy proxy, SGLang's mini load balancer, TensorRT-LLM's disagg
//! server), on loopback with ports picked at runtime.

mod sglang;
mod trtllm;
mod vllm;

use kvpick_sim::{Engine, EngineConfig, Flavour, PdRole};

use crate::support::{Http, eventually, fast_config, metric};

/// A prompt of 70 words: 4 full blocks of 16 and a partial one.
pub const PROMPT: &str = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho \
    sigma tau upsilon phi chi psi omega one two three four five six seven eight nine ten eleven twelve thirteen \
    fourteen fifteen sixteen seventeen eighteen nineteen twenty red orange yellow green blue indigo violet black \
    white grey brown pink cyan magenta north south east west up down left right";

pub fn config(flavour: Flavour, role: PdRole, name: &str) -> EngineConfig {
    EngineConfig { name: name.into(), flavour, pd_role: role, ..fast_config(16, 1024) }
}

/// A prefill and a decode engine of `flavour`, `tune`d.
pub async fn pair(flavour: Flavour, tune: impl Fn(&mut EngineConfig)) -> (Engine, Engine) {
    let mut prefill = config(flavour, PdRole::Prefill, "prefill");
    let mut decode = config(flavour, PdRole::Decode, "decode");
    tune(&mut prefill);
    tune(&mut decode);
    let prefill = Engine::start(prefill).await.expect("prefill engine starts");
    let decode = Engine::start(decode).await.expect("decode engine starts");
    assert!(prefill.endpoints().bootstrap.is_some(), "a prefill engine has a side channel");
    assert!(decode.endpoints().bootstrap.is_none(), "a decode engine has none");
    (prefill, decode)
}

pub fn url(engine: &Engine, path: &str) -> String {
    format!("{}{path}", engine.endpoints().base_url())
}

/// `sim:kv_transfers_total{result}` of `engine`.
pub async fn transfers(http: &Http, engine: &Engine, result: &str) -> f64 {
    let page = http.get(&url(engine, "/metrics")).await.text();
    metric(&page, "sim:kv_transfers_total", &format!("result=\"{result}\"")).unwrap_or(-1.0)
}

/// `sim:kv_holds_released_total{reason}` of `engine`.
pub async fn released(http: &Http, engine: &Engine, reason: &str) -> f64 {
    let page = http.get(&url(engine, "/metrics")).await.text();
    metric(&page, "sim:kv_holds_released_total", &format!("reason=\"{reason}\"")).unwrap_or(-1.0)
}

/// Waits until `engine` holds nothing for a transfer and runs nothing.
pub async fn settles(engine: &Engine) {
    eventually("the engine holds and runs nothing", || async {
        let stats = engine.stats().await.expect("stats");
        stats.held_transfers == 0 && stats.held_blocks == 0 && stats.running == 0 && stats.waiting == 0
    })
    .await;
}
