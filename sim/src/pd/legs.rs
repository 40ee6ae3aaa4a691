//! The two legs of a disaggregated request, run as tasks that feed the
//! HTTP answer's progress channel (the same [`Progress`] an aggregated
//! request's answer reads), and the choice of leg for a request.
//!
//! Each leg task stops as soon as its answer's receiver is dropped (the
//! client went away): dropping it drops the scheduler's receiver (the
//! engine aborts the request), the side-channel connection (the prefill
//! stops waiting) and, for an SGLang prefill waiting to be pulled, its
//! hold (released at once rather than at lease end).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;

use super::side_channel::{self, PullRequest};
use super::{Offer, STALE_AFTER_LEASE, bootstrap, nixl, trtllm};
use crate::config::{Flavour, KvLoadFailurePolicy, PdRole};
use crate::engine_loop::Progress;
use crate::error::SimError;
use crate::http_server::{ApiError, HttpState};
use crate::scheduler::{PdOptions, RequestId, RequestSpec};
use crate::tokenizer::token_text;

/// Where a prefill's offer is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OfferKey {
    /// Known before the request runs (vLLM's request id, SGLang's room).
    Named(String),
    /// TensorRT-LLM's `ctx_request_id`: the engine's own request id.
    CtxRequestId,
}

impl OfferKey {
    fn resolve(&self, id: RequestId) -> String {
        match self {
            OfferKey::Named(key) => key.clone(),
            OfferKey::CtxRequestId => trtllm::offer_key(id),
        }
    }
}

/// A prefill leg: computes, holds its blocks behind an offer.
#[derive(Clone, Debug)]
pub(crate) struct PrefillLeg {
    pub(crate) key: OfferKey,
    pub(crate) block_ids: Vec<u64>,
    /// SGLang: the answer waits (this long at most) for the decode's pull;
    /// past it the request fails and its blocks are freed.
    pub(crate) wait_for_pull: Option<Duration>,
    /// The message of a failed wait, before the reason.
    pub(crate) failure: String,
}

/// Which token a decode answer starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstToken {
    /// Its own (vLLM samples the first token again).
    Own,
    /// The one the prefill sampled, sent with the KV (SGLang).
    FromPrefill,
    /// The one the request names (TensorRT-LLM's `first_gen_tokens`).
    Given(u32),
}

/// A decode leg: pulls, charges the transfer, decodes the rest.
#[derive(Clone, Debug)]
pub(crate) struct DecodeLeg {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) pull: PullRequest,
    pub(crate) first_token: FirstToken,
    /// vLLM computes the prompt's last token again even when all of it
    /// arrived (its scheduler needs one token to compute).
    pub(crate) recompute_last: bool,
    /// vLLM's `kv_load_failure_policy`; SGLang and TensorRT-LLM fail.
    pub(crate) on_failure: KvLoadFailurePolicy,
    /// The message of a failed pull, before the reason.
    pub(crate) failure: String,
}

/// How a request runs on this engine.
#[derive(Debug)]
pub(crate) enum Leg {
    Aggregated,
    Prefill(PrefillLeg),
    Decode(DecodeLeg),
}

/// What a P/D request adds to the answer.
#[derive(Clone, Debug, Default)]
pub(crate) enum PdReply {
    #[default]
    None,
    /// vLLM's top-level `kv_transfer_params`.
    Nixl(Value),
    /// TensorRT-LLM's `choices[0].disaggregated_params` (built from the
    /// outcome: the request id and first token are known at the end).
    Trtllm(trtllm::ContextReply),
}

/// Reads the request's P/D fields for this engine's flavour and role; may
/// change the spec (a prefill leg generates one token). Fields an engine
/// of this role ignores are ignored.
pub(crate) fn plan(
    state: &HttpState,
    body: &Value,
    request_id: &str,
    spec: &mut RequestSpec,
    stream: bool,
) -> Result<(Leg, PdReply), ApiError> {
    let role = state.config.pd_role;
    if role == PdRole::Aggregated {
        return Ok((Leg::Aggregated, PdReply::None));
    }
    match state.config.flavour {
        Flavour::Vllm => nixl::plan(state, body, request_id, spec, stream),
        Flavour::Sglang => bootstrap::plan(state, body, request_id, spec),
        Flavour::Trtllm => trtllm::plan(state, body, spec, stream),
    }
}

/// Starts a request's leg; its progress arrives on the receiver.
pub(crate) fn start(
    state: &Arc<HttpState>,
    spec: RequestSpec,
    leg: Leg,
) -> Result<UnboundedReceiver<Progress>, SimError> {
    match leg {
        Leg::Aggregated => state.engine.submit(spec),
        Leg::Prefill(leg) => {
            let prompt = spec.prompt.clone();
            let inner = state.engine.submit_pd(spec, PdOptions { transferred_tokens: 0, hold_blocks: true })?;
            let state = Arc::clone(state);
            Ok(spawn(move |tx| run_prefill(state, inner, prompt, leg, tx)))
        }
        Leg::Decode(leg) => {
            let state = Arc::clone(state);
            Ok(spawn(move |tx| run_decode(state, spec, leg, tx)))
        }
    }
}

/// Runs `leg` until it ends or its receiver is dropped.
fn spawn<F, Fut>(leg: F) -> UnboundedReceiver<Progress>
where
    F: FnOnce(UnboundedSender<Progress>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let watch = tx.clone();
    let run = leg(tx);
    tokio::spawn(async move {
        tokio::select! {
            _ = watch.closed() => {}
            _ = run => {}
        }
    });
    rx
}

async fn run_prefill(
    state: Arc<HttpState>,
    mut inner: UnboundedReceiver<Progress>,
    prompt: Vec<u32>,
    leg: PrefillLeg,
    tx: UnboundedSender<Progress>,
) {
    let mut tokens = Vec::new();
    let mut first_token = None;
    loop {
        let Some(progress) = inner.recv().await else { return };
        match progress {
            Progress::Token { token_id, text } => {
                first_token = first_token.or(Some(token_id));
                let token = Progress::Token { token_id, text };
                // SGLang answers once the KV left: hold the tokens back.
                if leg.wait_for_pull.is_some() {
                    tokens.push(token);
                } else if tx.send(token).is_err() {
                    return;
                }
            }
            Progress::Finished(outcome) => {
                let key = leg.key.resolve(outcome.id);
                let (pulled, was_pulled) = match leg.wait_for_pull {
                    Some(_) => {
                        let (pulled, was_pulled) = oneshot::channel();
                        (Some(pulled), Some(was_pulled))
                    }
                    None => (None, None),
                };
                let offer = Offer {
                    hold: outcome.id,
                    block_ids: leg.block_ids.clone(),
                    token_ids: prompt,
                    first_token,
                    pulled,
                    stale_after: std::time::Instant::now()
                        + Duration::from_millis(state.config.kv_lease_ms)
                        + STALE_AFTER_LEASE,
                };
                if let Some(replaced) = state.hub.offer(key.clone(), offer) {
                    state.engine.release_hold(replaced);
                }
                if let (Some(wait), Some(was_pulled)) = (leg.wait_for_pull, was_pulled) {
                    let guard = HoldGuard { state: &state, key: &key, hold: outcome.id };
                    match tokio::time::timeout(wait, was_pulled).await {
                        Ok(Ok(())) => std::mem::forget(guard),
                        Ok(Err(_)) => {
                            drop(guard);
                            let _ = tx.send(Progress::Failed(format!("{}the transfer was cut", leg.failure)));
                            return;
                        }
                        Err(_) => {
                            drop(guard);
                            let message = format!("{}no decode pulled {key} within {wait:?}", leg.failure);
                            let _ = tx.send(Progress::Failed(message));
                            return;
                        }
                    }
                    for token in tokens.drain(..) {
                        let _ = tx.send(token);
                    }
                }
                let _ = tx.send(Progress::Finished(outcome));
                return;
            }
            end @ (Progress::Rejected(_) | Progress::Aborted(_) | Progress::Failed(_)) => {
                let _ = tx.send(end);
                return;
            }
        }
    }
}

/// Gives an SGLang prefill's hold up when its wait ends without a pull
/// (timed out, or the task dropped because the client left).
struct HoldGuard<'a> {
    state: &'a HttpState,
    key: &'a str,
    hold: RequestId,
}

impl Drop for HoldGuard<'_> {
    fn drop(&mut self) {
        self.state.hub.withdraw(self.key, self.hold);
        self.state.engine.release_hold(self.hold);
    }
}

async fn run_decode(state: Arc<HttpState>, spec: RequestSpec, leg: DecodeLeg, tx: UnboundedSender<Progress>) {
    let pulled = match side_channel::pull(&leg.host, leg.port, &leg.pull).await {
        Ok(pulled) if !spec.prompt.starts_with(&pulled.token_ids) => Err(side_channel::PullFailure {
            result: "mismatch",
            message: format!("the KV pulled for {} is not this prompt's", leg.pull.key),
        }),
        other => other,
    };
    state.pd.transfer(pulled.as_ref().map_or_else(|f| f.result, |_| "ok"));
    let (transferred, first_token) = match pulled {
        Ok(pulled) => {
            let mut transferred = pulled.token_ids.len();
            if leg.recompute_last && transferred == spec.prompt.len() {
                transferred -= 1;
            }
            charge_transfer(&state, pulled.token_ids.len()).await;
            let first_token = match leg.first_token {
                FirstToken::Own => None,
                FirstToken::FromPrefill => pulled.first_token,
                FirstToken::Given(token) => Some(token),
            };
            (transferred, first_token)
        }
        Err(failure) => {
            tracing::info!(engine = %state.config.name, key = %leg.pull.key, result = failure.result,
                reason = %failure.message, "KV pull failed");
            match leg.on_failure {
                KvLoadFailurePolicy::Recompute => (0, None),
                KvLoadFailurePolicy::Fail => {
                    let _ = tx.send(Progress::Failed(format!("{}{}", leg.failure, failure.message)));
                    return;
                }
            }
        }
    };
    let options = PdOptions { transferred_tokens: transferred, hold_blocks: false };
    let mut inner = match state.engine.submit_pd(spec, options) {
        Ok(inner) => inner,
        Err(error) => {
            let _ = tx.send(Progress::Aborted(error.to_string()));
            return;
        }
    };
    // The answer starts from the prefill's token: it takes the place of
    // the first one sampled here (same length, same accounting).
    let mut replace_first = first_token;
    while let Some(progress) = inner.recv().await {
        let progress = match (progress, replace_first.take()) {
            (Progress::Token { .. }, Some(token_id)) => Progress::Token { token_id, text: token_text(token_id) },
            (progress, _) => progress,
        };
        if tx.send(progress).is_err() {
            return;
        }
    }
}

/// Waits out the transfer of `tokens` tokens' blocks, in virtual time
/// (`kv_transfer_ns_per_block` per block, scaled like the steps).
async fn charge_transfer(state: &HttpState, tokens: usize) {
    let blocks = tokens.div_ceil(state.config.block_size as usize) as f64;
    let scale = state.config.time.time_scale;
    if !scale.is_finite() {
        return;
    }
    let seconds = blocks * state.config.kv_transfer_ns_per_block as f64 / 1e9 / scale;
    if let Ok(wait) = Duration::try_from_secs_f64(seconds) {
        tokio::time::sleep(wait).await;
    }
}

/// `n` block numbers for an offer, as a vLLM prefill names the blocks it
/// holds (opaque to the decode: it only echoes them).
pub(crate) fn block_ids(state: &HttpState, prompt_len: usize) -> Vec<u64> {
    let n = prompt_len.div_ceil(state.config.block_size as usize) as u64;
    let start = state.next_block.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    let capacity = state.config.num_blocks as u64;
    (start..start + n).map(|b| b % capacity).collect()
}
