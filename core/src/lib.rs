//! kvpick's selection core: which worker should serve a prompt.
//!
//! It indexes the KV blocks each worker holds (from the engines' own KV
//! events), tracks the load booked on each worker by reservations, and picks
//! the cheapest worker for a prompt. Everything here is plain data and
//! synchronous code: no I/O, no threads, no async runtime, no clock (time
//! is passed in), so it runs the same in the thread-per-core runtime
//! (`kvpick-runtime`), in a test, or in a fuzzer. It must never depend on
//! an executor, tokio, tonic, kube or any socket.
//!
//! State is owned by [`Shard`]s, each a set of workers touched by one thread
//! only. Every pick is [`PickPolicy::decide`]; [`SelectionService`] drives S
//! shards from the caller's thread and is the reference the multi-threaded
//! runtime must match exactly.

pub mod admission;
pub mod booking;
pub mod calibration;
pub mod clock;
pub mod cost;
pub mod directory;
pub mod error_chain;
pub mod event;
pub mod hashing;
pub mod index;
pub mod load;
pub mod outage;
pub mod pick;
pub mod prompt;
pub mod queue;
pub mod replica;
pub mod request;
pub mod service;
pub mod shard;
pub mod slot_set;
#[cfg(test)]
mod test_rng;
pub mod worker;

pub use admission::AdmissionLedger;
pub use booking::{Booking, BookingEvent, ReservationId};
pub use calibration::{Calibration, CalibrationConfig, SampleError, WorkerCalibration};
pub use clock::Millis;
pub use cost::{Candidate, CostModel, EngineRates, RouterConfig};
pub use event::{EngineBlockHash, KvEvent};
pub use hashing::{HashSeed, SequenceHash};
pub use index::{EventError, KvIndex};
pub use pick::{Decision, PickPolicy};
pub use prompt::Prompt;
pub use request::{Admission, AdmissionEvent, SelectError, SelectRequest, Selection, ServiceStats, WorkerError};
pub use service::{Expired, SelectionService};
pub use shard::{BookingError, LoadSnapshot, Shard};
pub use worker::{EndpointFilter, Lifecycle, WorkerId, WorkerSpec};
