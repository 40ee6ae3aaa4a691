//! Several simulated engines in one process: started together, listed
//! together, stopped together.

use std::net::SocketAddr;

use serde_json::{Value, json};

use super::config::{EngineConfig, Ports};
use super::engine::{Engine, EngineEndpoints};
use super::error::SimError;

/// A set of running engines, indexed from 0.
#[derive(Debug)]
pub struct Fleet {
    engines: Vec<Engine>,
}

impl Fleet {
    /// Configurations of `n` engines made from `base`: engine `i` is named
    /// `engine-i`, gets its own seed (so its own block hashes, unless
    /// `base.hash_seed` is set) and OS-picked ports (the side channel's
    /// too). Edit them before
    /// [`Fleet::start_with`] to differ further.
    pub fn configs(n: usize, base: &EngineConfig) -> Vec<EngineConfig> {
        (0..n)
            .map(|i| EngineConfig {
                name: format!("engine-{i}"),
                seed: base.seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                ports: Ports::default(),
                bootstrap_port: None,
                ..base.clone()
            })
            .collect()
    }

    /// Starts `n` engines configured by [`Fleet::configs`].
    pub async fn start(n: usize, base: &EngineConfig) -> Result<Fleet, SimError> {
        Fleet::start_with(Fleet::configs(n, base)).await
    }

    /// Starts one engine per configuration, in order; if one fails, those
    /// already started are stopped.
    pub async fn start_with(configs: Vec<EngineConfig>) -> Result<Fleet, SimError> {
        let mut fleet = Fleet { engines: Vec::with_capacity(configs.len()) };
        for config in configs {
            match Engine::start(config).await {
                Ok(engine) => fleet.engines.push(engine),
                Err(error) => {
                    fleet.shutdown().await;
                    return Err(error);
                }
            }
        }
        Ok(fleet)
    }

    pub fn engines(&self) -> &[Engine] {
        &self.engines
    }

    pub fn get(&self, i: usize) -> Option<&Engine> {
        self.engines.get(i)
    }

    pub fn len(&self) -> usize {
        self.engines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// The engine serving HTTP at `addr` (e.g. the `ip:port` a router picked).
    pub fn by_http(&self, addr: SocketAddr) -> Option<&Engine> {
        self.engines.iter().find(|e| e.endpoints().http == addr)
    }

    pub fn endpoints(&self) -> Vec<EngineEndpoints> {
        self.engines.iter().map(|e| e.endpoints().clone()).collect()
    }

    /// `{"engines": [{"name", "http", "events", "replay"}, …]}`.
    pub fn endpoints_json(&self) -> Value {
        json!({"engines": self.engines.iter().map(|e| e.endpoints().to_json()).collect::<Vec<_>>()})
    }

    /// Stops every engine still running.
    pub async fn shutdown(&self) {
        for engine in &self.engines {
            engine.shutdown().await;
        }
    }
}

impl std::ops::Index<usize> for Fleet {
    type Output = Engine;
    fn index(&self, i: usize) -> &Engine {
        &self.engines[i]
    }
}
