//! What can go wrong starting, driving or calling a simulated engine.

use super::config::ConfigError;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid engine configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr} for {what}: {source}")]
    Listen {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("ZMQ {what}: {source}")]
    Zmq {
        what: &'static str,
        #[source]
        source: zmq::Error,
    },
    /// The model directory's tokenizer or template cannot be loaded.
    #[error("cannot load the model directory's tokenizer: {0}")]
    Tokenizer(String),
    #[error("cannot start the publisher thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The engine was shut down (or its loop ended).
    #[error("engine {0} is stopped")]
    Stopped(String),
    /// The request breaks the engine's limits (HTTP 400).
    #[error("request rejected: {0}")]
    Rejected(String),
    /// The engine dropped the request (restart or shutdown).
    #[error("request aborted: {0}")]
    Aborted(String),
}
