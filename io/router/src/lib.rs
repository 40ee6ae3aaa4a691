//! kvpick's routing front: what the ext_proc server's [`Picks`] trait is
//! implemented with. [`Picker`] is kvpick's KV- and load-aware pick
//! ([`KvPicker`]: tokenize, hash, select and book on the shards) or a
//! baseline ([`NullPicker`]); [`reservation`] frees a booking exactly once;
//! [`tokenizer`] holds the engines' tokenizer clients; [`prefix_watch`]
//! suspects a worker whose cache kvpick's hashes never match.
//!
//! Depends on `kvpick-ext-proc` (the Pick API it implements), `kvpick-core`
//! and `kvpick-runtime`; none of them may depend on it. Knows no flag or
//! environment variable: the app fills [`PickerConfig`] and
//! [`tokenizer::TokenizerConfig`].
//!
//! [`Picks`]: kvpick_ext_proc::Picks

pub mod disagg;
pub mod picker;
pub mod prefix_watch;
pub mod reservation;
pub mod sessions;
pub mod tokenizer;

pub use disagg::{DEFAULT_PREFILL_QUEUE_THRESHOLD, DecodeOnly, DisaggConfig, Leg, PlanBooking};
pub use picker::{Explained, KvBooking, KvPick, KvPicker, KvReservation, NullPicker, Picker, PickerConfig};
pub use reservation::{Release, Reservation, ReservationIds};
