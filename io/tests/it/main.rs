//! kvpick-io's integration tests, one binary (one link instead of one per
//! file). Every server a test needs (simulated engines, tokenizer stubs,
//! the fake Kubernetes API, gateways) is started by the test on 127.0.0.1
//! with a port picked at run time, and stopped by it.

mod bin_support;
mod ext_proc_support;
mod support;
mod tokenizer_stub;

mod bin_kubernetes;
mod bin_serve;
mod discovery_peers;
mod discovery_resilience;
mod discovery_workers;
mod ext_proc_errors;
mod ext_proc_fallbacks;
mod ext_proc_health;
mod ext_proc_lifecycle;
mod ext_proc_request;
mod ext_proc_scale;
mod ext_proc_subset;
mod tokenizer_sglang;
mod tokenizer_transport;
mod tokenizer_vllm_render;
