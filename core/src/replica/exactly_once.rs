//! A checker for tests and fuzzers: the booking changes an inbox hands a
//! replica's shards must apply each change exactly once.

use std::collections::HashMap;

use crate::booking::{BookingEvent, ReservationId};
use crate::worker::WorkerId;

/// Follows the live bookings a stream of changes leaves, refusing what a
/// shard would refuse: a second `Reserved` of a live id, and any change to
/// an id that is not live (an inbox must never send either).
#[derive(Default, Debug, PartialEq)]
pub struct ExactlyOnce {
    /// Live bookings: their worker and whether prefill is over.
    pub live: HashMap<ReservationId, (WorkerId, bool)>,
}

impl ExactlyOnce {
    pub fn apply(&mut self, events: &[BookingEvent]) -> Result<(), String> {
        for event in events {
            match event {
                BookingEvent::Reserved(b) => {
                    if self.live.insert(b.id, (b.worker, false)).is_some() {
                        return Err(format!("{:?} booked twice", b.id));
                    }
                }
                BookingEvent::PrefillComplete(id) => match self.live.get_mut(id) {
                    None => return Err(format!("{id:?} completed but not live")),
                    Some((_, true)) => return Err(format!("{id:?} completed twice")),
                    Some((_, done)) => *done = true,
                },
                BookingEvent::Renewed { id, .. } if !self.live.contains_key(id) => {
                    return Err(format!("{id:?} renewed but not live"));
                }
                BookingEvent::Renewed { .. } => {}
                BookingEvent::Freed(id) => {
                    if self.live.remove(id).is_none() {
                        return Err(format!("{id:?} freed but not live"));
                    }
                }
            }
        }
        Ok(())
    }
}
