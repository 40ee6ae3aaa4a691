//! Where one selection's time went, for a request's trace: filled only
//! when a caller asks (`ShardedService::select_and_wait_timed`), so an
//! untraced pick reads no clock.

use std::time::Instant;

/// Instants of one selection's steps, as its caller saw them.
#[derive(Clone, Debug, Default)]
pub struct SelectTiming {
    /// Each shard asked, in the order the caller took the answers.
    pub shards: Vec<ShardAnswer>,
    /// The pick was decided (after the last shard's candidates).
    pub decided: Option<Instant>,
    /// The owning shard acknowledged the booking.
    pub booked: Option<Instant>,
    /// The request waited in the queue: when it was queued and when it
    /// was admitted or refused.
    pub queued: Option<(Instant, Instant)>,
}

/// One shard's part of a selection.
#[derive(Clone, Copy, Debug)]
pub struct ShardAnswer {
    pub shard: usize,
    /// When the caller held the shard's answer. Answers are taken in shard
    /// order, so a shard that answered before the one ahead of it shows
    /// that one's time.
    pub at: Instant,
    /// Candidates it offered; `None` when the shard picked and booked in
    /// the same visit (a single shard), so its candidates never left it.
    pub candidates: Option<usize>,
}

impl SelectTiming {
    pub(crate) fn shard_answered(timing: &mut Option<&mut SelectTiming>, shard: usize, candidates: Option<usize>) {
        if let Some(timing) = timing {
            timing.shards.push(ShardAnswer { shard, at: Instant::now(), candidates });
        }
    }

    pub(crate) fn mark(timing: &mut Option<&mut SelectTiming>, step: fn(&mut SelectTiming) -> &mut Option<Instant>) {
        if let Some(timing) = timing {
            *step(timing) = Some(Instant::now());
        }
    }
}
