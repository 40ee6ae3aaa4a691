//! One replay request in flight: a DEALER on the engine's replay ROUTER.
//!
//! A fresh socket per replay, closed when it ends, so replies of a replay
//! that was given up can never be mistaken for those of the next one. The
//! idle deadline moves with every reply: a large replay that keeps
//! streaming is never cut off, a silent one is. Before the first reply the
//! engine gets the whole idle timeout to start answering; once it has
//! started, an answer streams from its buffer in one go, so a shorter
//! silence ([`MID_ANSWER_SILENCE`]) already means the answer was cut short
//! (see `Sequencer::resume_replay`), and the replay is asked again sooner.

use std::time::{Duration, Instant};

use crate::wire::frames::replay_request;

/// Silence after a reply that ends a replay's answer early. An early end
/// costs one more request (replies already applied are not asked again).
pub(crate) const MID_ANSWER_SILENCE: Duration = Duration::from_millis(250);

pub(crate) struct ReplaySession {
    socket: zmq::Socket,
    idle_timeout: Duration,
    deadline: Instant,
}

impl ReplaySession {
    /// Connects and asks for every buffered batch from `from` on.
    pub(crate) fn start(
        ctx: &zmq::Context,
        endpoint: &str,
        from: u64,
        idle_timeout: Duration,
        max_frame_bytes: i64,
    ) -> Result<Self, zmq::Error> {
        let socket = ctx.socket(zmq::DEALER)?;
        socket.set_linger(0)?;
        socket.set_maxmsgsize(max_frame_bytes)?;
        // Unlimited: the ROUTER drops what does not fit in our queue, and
        // the reply is bounded by the engine's buffer (10,000 batches).
        socket.set_rcvhwm(0)?;
        socket.connect(endpoint)?;
        // Queued until the connection is up (DEALER pipes exist from connect).
        socket.send_multipart(replay_request(from), zmq::DONTWAIT)?;
        Ok(ReplaySession { socket, idle_timeout, deadline: Instant::now() + idle_timeout })
    }

    pub(crate) fn socket(&self) -> &zmq::Socket {
        &self.socket
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The next reply, if one is waiting; any reply extends the deadline
    /// (by [`MID_ANSWER_SILENCE`] at most).
    pub(crate) fn try_recv(&mut self) -> Result<Option<Vec<Vec<u8>>>, zmq::Error> {
        match self.socket.recv_multipart(zmq::DONTWAIT) {
            Ok(frames) => {
                self.deadline = Instant::now() + self.idle_timeout.min(MID_ANSWER_SILENCE);
                Ok(Some(frames))
            }
            Err(zmq::Error::EAGAIN) => Ok(None),
            Err(error) => Err(error),
        }
    }
}
