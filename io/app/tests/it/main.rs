//! kvpick-app's integration tests, one binary: the ext_proc server with
//! kvpick's picker as the wiring puts them together (protocol, errors,
//! health, scale), and the `kvpick` binary itself. Every server a test
//! needs (simulated engines, gateways, the fake Kubernetes API) is started
//! by the test on 127.0.0.1 with a port picked at run time, and stopped by
//! it.

mod bin_support;
mod ext_proc_support;

mod bin_disagg;
mod bin_kubernetes;
mod bin_local_tokenizer;
mod bin_replicas;
mod bin_serve;
mod bin_sglang;
mod bin_sidecar;
mod bin_trtllm;
mod deploy;
mod ext_proc_disagg;
mod ext_proc_errors;
mod ext_proc_fallbacks;
mod ext_proc_health;
mod ext_proc_lifecycle;
mod ext_proc_request;
mod ext_proc_scale;
mod ext_proc_subset;
mod otlp_tracing;
mod replicas;
mod replicas_nats;
mod replicas_partition;
mod replicas_tls;
mod replicas_warm;
