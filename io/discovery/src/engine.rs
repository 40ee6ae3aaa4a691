//! Which engine a worker runs, and so where its KV events come from.
//!
//! | engine | KV events |
//! |---|---|
//! | `vllm`, `sglang` | ZMQ PUB on `kv_event_port + rank` (replay on `kv_event_replay_port + rank`) |
//! | `trtllm` | `trtllm-serve`'s drain, `POST http://podIP:port/kv_cache_events` on each target port |
//! | `trtllm-zmq` | TensorRT-LLM's native ZMQ publisher: like vLLM's, ports offset by global rank |
//!
//! In Kubernetes a pod's engine is its `kvpick.io/engine` label when it has
//! one, else, with `KVPICK_ENGINE=auto` (the default), guessed from its
//! containers' images (the engines' published images name them:
//! `vllm/vllm-openai`, `lmsysorg/sglang`, `nvcr.io/nvidia/tensorrt-llm/…`),
//! else vLLM; any other `KVPICK_ENGINE` value is the engine of every pod
//! without the label. So one pool can mix engines.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The pod label that names a pod's engine.
pub const ENGINE_LABEL: &str = "kvpick.io/engine";

/// An engine kind, as `KVPICK_ENGINE`, the `kvpick.io/engine` label and the
/// workers file's `engine` spell it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EngineKind {
    #[default]
    Vllm,
    Sglang,
    /// `trtllm-serve` drained over HTTP.
    Trtllm,
    /// TensorRT-LLM with its native ZMQ publisher.
    TrtllmZmq,
}

impl EngineKind {
    pub const ALL: [EngineKind; 4] = [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Trtllm, EngineKind::TrtllmZmq];

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Trtllm => "trtllm",
            EngineKind::TrtllmZmq => "trtllm-zmq",
        }
    }

    /// Whether its KV events are drained over HTTP rather than published
    /// over ZMQ.
    pub fn drains_events(self) -> bool {
        self == EngineKind::Trtllm
    }

    /// TensorRT-LLM has no tokenizer endpoint kvpick can ask (no render,
    /// no public `/tokenize`): its workers need `--tokenizer local:PATH`.
    pub fn is_tensorrt_llm(self) -> bool {
        matches!(self, EngineKind::Trtllm | EngineKind::TrtllmZmq)
    }

    /// A guess from a container image reference, `None` when it names no
    /// engine.
    pub fn from_image(image: &str) -> Option<EngineKind> {
        // The repository path, without registry port, tag or digest.
        let path = image.split('@').next().unwrap_or(image);
        let path = match path.rsplit_once(':') {
            Some((head, tag)) if !tag.contains('/') => head,
            _ => path,
        };
        let path = path.to_ascii_lowercase();
        if path.contains("tensorrt-llm") || path.contains("tensorrt_llm") || path.contains("trtllm") {
            Some(EngineKind::Trtllm)
        } else if path.contains("sglang") {
            Some(EngineKind::Sglang)
        } else if path.contains("vllm") {
            Some(EngineKind::Vllm)
        } else {
            None
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EngineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s.trim())
            .ok_or_else(|| format!("unknown engine {s:?}: expected vllm, sglang, trtllm or trtllm-zmq"))
    }
}

/// `KVPICK_ENGINE`: the engine of pods without the label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineSetting {
    /// Guessed from the pod's images, vLLM when they say nothing.
    #[default]
    Auto,
    Fixed(EngineKind),
}

impl EngineSetting {
    /// The engine of a pod with these labels and container images. A label
    /// naming no known engine is ignored (and said so by the caller's log
    /// through `Err`).
    pub fn resolve<'a>(
        self,
        labels: &BTreeMap<String, String>,
        mut images: impl Iterator<Item = &'a str>,
    ) -> Result<EngineKind, (EngineKind, String)> {
        let fallback = match self {
            EngineSetting::Fixed(kind) => kind,
            EngineSetting::Auto => images.find_map(EngineKind::from_image).unwrap_or_default(),
        };
        match labels.get(ENGINE_LABEL) {
            None => Ok(fallback),
            Some(label) => label.parse().map_err(|why| (fallback, why)),
        }
    }
}

impl FromStr for EngineSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim() == "auto" {
            Ok(EngineSetting::Auto)
        } else {
            s.parse()
                .map(EngineSetting::Fixed)
                .map_err(|_| format!("unknown engine {s:?}: expected auto, vllm, sglang, trtllm or trtllm-zmq"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_name_their_engine() {
        let cases = [
            ("vllm/vllm-openai:v0.26.0", Some(EngineKind::Vllm)),
            ("docker.io/lmsysorg/sglang:v0.5.9-cu129", Some(EngineKind::Sglang)),
            ("nvcr.io/nvidia/tensorrt-llm/release:1.2.0", Some(EngineKind::Trtllm)),
            ("registry.local:5000/team/trtllm-serve@sha256:abcd", Some(EngineKind::Trtllm)),
            ("ghcr.io/llm-d/llm-d-cuda:v0.4", None),
            ("busybox", None),
            // A tag is not a repository: "vllm" here names nothing.
            ("registry.local:5000/inference:vllm", None),
        ];
        for (image, want) in cases {
            assert_eq!(EngineKind::from_image(image), want, "{image}");
        }
    }

    #[test]
    fn the_label_wins_then_the_setting_then_the_images() {
        let labels = |v: &str| BTreeMap::from([(ENGINE_LABEL.to_owned(), v.to_owned())]);
        let none = BTreeMap::new();
        let images = ["lmsysorg/sglang:latest", "busybox"];
        assert_eq!(EngineSetting::Auto.resolve(&none, images.into_iter()), Ok(EngineKind::Sglang));
        assert_eq!(EngineSetting::Auto.resolve(&none, ["busybox"].into_iter()), Ok(EngineKind::Vllm));
        let fixed = EngineSetting::Fixed(EngineKind::Trtllm);
        assert_eq!(fixed.resolve(&none, images.into_iter()), Ok(EngineKind::Trtllm));
        assert_eq!(fixed.resolve(&labels("trtllm-zmq"), images.into_iter()), Ok(EngineKind::TrtllmZmq));
        let bad = EngineSetting::Auto.resolve(&labels("tgi"), images.into_iter());
        assert!(matches!(bad, Err((EngineKind::Sglang, ref why)) if why.contains("tgi")), "{bad:?}");
    }

    #[test]
    fn settings_parse() {
        assert_eq!("auto".parse(), Ok(EngineSetting::Auto));
        assert_eq!(" trtllm ".parse(), Ok(EngineSetting::Fixed(EngineKind::Trtllm)));
        for kind in EngineKind::ALL {
            assert_eq!(kind.as_str().parse(), Ok(kind));
        }
        assert!("TensorRT".parse::<EngineSetting>().is_err());
    }
}
