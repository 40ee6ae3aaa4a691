//! kvpick-core's integration tests, one binary: the selection service
//! against an independent reference model (proptest), and hashing and
//! overlaps against NVIDIA Dynamo's published router crates.

mod dynamo_compat;
mod reference_model;
