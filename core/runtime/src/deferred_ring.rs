//! Doorbells rung once per batch of selections rather than once per push.
//!
//! An async I/O thread that turns many ready requests into picks in one
//! pass would otherwise wake a sleeping shard on the first push; the shard
//! answers it, parks, and is woken again by the next push microseconds
//! later. Each wake-up is a futex call on the I/O thread, a context switch
//! on the shard's, and often the I/O thread preempted by the woken shard.
//! Deferred, the pushes go in quietly and one ring, scheduled by the
//! caller's runtime to run after its other ready tasks, wakes the shard for
//! all of them; the answers then come back together too.
//!
//! Core owns no runtime: the caller supplies the scheduling
//! ([`RingScheduler`]), typically "spawn a task that yields once, then
//! calls [`PendingRings::ring`]".

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::shard_loop::ShardShared;

/// Called once per batch with the rings to ring; must see that
/// [`PendingRings::ring`] runs soon (no later than the caller's other ready
/// work), or the deferred commands wait for the shard's own drain deadline.
pub type RingScheduler = Arc<dyn Fn(PendingRings) + Send + Sync>;

/// One producer's deferred doorbells.
pub(crate) struct DeferredRings {
    shards: Vec<Arc<ShardShared>>,
    pending: Vec<AtomicBool>,
    scheduled: AtomicBool,
}

impl DeferredRings {
    pub(crate) fn new(shards: &[Arc<ShardShared>]) -> Arc<Self> {
        Arc::new(DeferredRings {
            shards: shards.to_vec(),
            pending: shards.iter().map(|_| AtomicBool::new(false)).collect(),
            scheduled: AtomicBool::new(false),
        })
    }

    /// After a quiet push to `shard`: the handle to schedule, when no ring
    /// is scheduled yet.
    pub(crate) fn defer(self: &Arc<Self>, shard: usize) -> Option<PendingRings> {
        // SeqCst on both flags, here and in `ring`: either this sees the
        // ring still scheduled and that ring sees our flag, or this
        // schedules another.
        self.pending[shard].store(true, Ordering::SeqCst);
        (!self.scheduled.swap(true, Ordering::SeqCst)).then(|| PendingRings(self.clone()))
    }
}

/// Rings what a producer deferred, when rung or dropped: a scheduler that
/// cannot run it (no runtime, shutting down) rings at once by dropping it.
/// Any thread may ring.
pub struct PendingRings(Arc<DeferredRings>);

impl std::fmt::Debug for PendingRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRings").field("shards", &self.0.shards.len()).finish_non_exhaustive()
    }
}

impl PendingRings {
    pub fn ring(self) {
        drop(self);
    }
}

impl Drop for PendingRings {
    fn drop(&mut self) {
        let deferred = &*self.0;
        deferred.scheduled.store(false, Ordering::SeqCst);
        for (shard, pending) in deferred.shards.iter().zip(&deferred.pending) {
            if pending.swap(false, Ordering::SeqCst) {
                shard.doorbell.ring();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn asleep(shard: &ShardShared) {
        assert!(shard.doorbell.prepare_sleep(|| false));
    }

    /// Whether the shard's doorbell was rung, waiting at most `wait`.
    fn rung_within(shard: &ShardShared, wait: Duration) -> bool {
        shard.doorbell.sleep_blocking(Some(Instant::now() + wait)).is_some()
    }

    #[test]
    fn a_batch_is_scheduled_once_and_rings_only_its_shards_when_rung() {
        let shards: Vec<Arc<ShardShared>> = (0..3).map(|_| Arc::default()).collect();
        shards.iter().for_each(|s| asleep(s));
        let deferred = DeferredRings::new(&shards);
        let pending = deferred.defer(0).expect("the first deferral schedules");
        assert!(deferred.defer(2).is_none(), "one ring per batch");
        assert!(deferred.defer(0).is_none());
        assert!(!rung_within(&shards[0], Duration::from_millis(5)), "nothing rings before the batch does");
        asleep(&shards[0]);
        pending.ring();
        assert!(rung_within(&shards[0], Duration::from_secs(5)));
        assert!(rung_within(&shards[2], Duration::from_secs(5)));
        assert!(!rung_within(&shards[1], Duration::from_millis(5)), "a shard with nothing deferred stays asleep");
        assert!(deferred.defer(1).is_some(), "after the ring, the next deferral schedules again");
    }

    #[test]
    fn a_dropped_batch_rings_at_once() {
        let shards: Vec<Arc<ShardShared>> = vec![Arc::default()];
        asleep(&shards[0]);
        let deferred = DeferredRings::new(&shards);
        drop(deferred.defer(0));
        assert!(rung_within(&shards[0], Duration::from_secs(5)));
    }
}
