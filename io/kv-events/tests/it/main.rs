//! kvpick-kv-events' integration tests, one binary: the decoder against
//! byte-exact engine fixtures, and the ingest thread against real ZMQ
//! publishers on 127.0.0.1 (started and stopped by each test).

mod common;

mod faults;
mod flow;
mod replay;
mod shards;
mod trtllm_drain;
mod warm;
mod wire_fixtures;
