//! End-to-end scenarios, one binary: kvpick in-process against simulated
//! engines (real HTTP and ZMQ on 127.0.0.1) behind a miniature gateway.

mod healing;
mod membership;
mod routing;
