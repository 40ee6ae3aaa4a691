//! kvpick-sim's integration tests, one binary: the simulated engine's
//! HTTP API, time model and KV events (decoded by kvpick's own decoder),
//! each engine started by its test on 127.0.0.1.

mod support;

mod events;
mod http;
mod model;
mod pd;
mod wire;
