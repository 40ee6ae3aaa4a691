//! kvpick-discovery's integration tests, one binary: the real kube client
//! and watchers against a fake API server on 127.0.0.1, started and
//! stopped by each test.

mod support;

mod peers;
mod resilience;
mod workers;
