//! Waking the ingest thread out of `zmq_poll` when a command is queued.
//!
//! Why an inproc PAIR and not a short poll timeout: the wake is immediate,
//! so adding or removing a publisher takes effect at once, and an idle
//! ingest sleeps in `zmq_poll` with no timer at all. A timeout would trade
//! command latency against idle wake-ups, each scanning every publisher's
//! socket. Commands themselves travel on a crossbeam channel; the PAIR
//! carries only empty "look at the channel" messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The sending end, shared by every handle.
pub(crate) struct Waker {
    socket: Mutex<zmq::Socket>,
}

impl Waker {
    /// Creates a connected pair: the waker and the socket the ingest polls.
    pub(crate) fn pair(ctx: &zmq::Context) -> Result<(Waker, zmq::Socket), zmq::Error> {
        let endpoint = format!("inproc://kvpick-kv-ingest-wake-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
        let receiver = ctx.socket(zmq::PAIR)?;
        receiver.set_linger(0)?;
        receiver.bind(&endpoint)?;
        let sender = ctx.socket(zmq::PAIR)?;
        sender.set_linger(0)?;
        sender.connect(&endpoint)?;
        Ok((Waker { socket: Mutex::new(sender) }, receiver))
    }

    /// Wakes the poll. Call after queueing the command, so the thread sees
    /// it once awake. A full pipe means wake-ups are already pending.
    pub(crate) fn wake(&self) {
        let socket = self.socket.lock().unwrap_or_else(PoisonError::into_inner);
        match socket.send(&[][..], zmq::DONTWAIT) {
            Ok(()) | Err(zmq::Error::EAGAIN) => {}
            Err(error) => tracing::warn!(%error, "could not wake the KV-event ingest thread"),
        }
    }
}

/// Takes every pending wake-up off the receiving end.
pub(crate) fn drain(receiver: &zmq::Socket) {
    while receiver.recv_bytes(zmq::DONTWAIT).is_ok() {}
}
