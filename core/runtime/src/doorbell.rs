//! Wakes a parked shard when a producer has put something in its rings.
//!
//! Producers ring only when the shard said it is going to sleep, so a busy
//! shard costs producers one fence and one load per message. The `sleeping`
//! store and the ring re-check on the shard side, and the push and the
//! `sleeping` load on the producer side, are each separated by a SeqCst
//! fence: at least one side sees the other, so no wake-up is lost.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;

#[derive(Debug)]
pub(crate) struct Doorbell {
    sleeping: AtomicBool,
    rung: AtomicBool,
    /// When the sleeping shard was first rung (ns since `ORIGIN`; `NEVER`
    /// when not): how long the shard was idle, for its spin policy, without
    /// counting the wake-up itself.
    rung_at: AtomicU64,
    /// When the shard last went to sleep (ns since `ORIGIN`; `NEVER` while
    /// awake), for the glommio watchdog (`nudge`).
    asleep_since: AtomicU64,
    waker: AtomicWaker,
    /// The glommio executor thread that sleeps on this doorbell, while it
    /// runs (see `nudge`); held locked while it is signalled, so it is
    /// never signalled after it has gone.
    thread: Mutex<Option<u64>>,
}

const NEVER: u64 = u64::MAX;
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

impl Default for Doorbell {
    fn default() -> Self {
        Doorbell {
            sleeping: AtomicBool::new(false),
            rung: AtomicBool::new(false),
            rung_at: AtomicU64::new(NEVER),
            asleep_since: AtomicU64::new(NEVER),
            waker: AtomicWaker::new(),
            thread: Mutex::new(None),
        }
    }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

impl Doorbell {
    /// Producer side, after a push. Returns whether the shard had said it
    /// was going to sleep: then its answer is a wake-up away (tens of µs),
    /// otherwise it is polling its rings and answers within microseconds.
    pub(crate) fn ring(&self) -> bool {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            let now = ORIGIN.elapsed().as_nanos();
            self.rung_at.fetch_min(u64::try_from(now).unwrap_or(NEVER), Ordering::Relaxed);
            self.rung.store(true, Ordering::Release);
            self.waker.wake();
            true
        } else {
            false
        }
    }

    /// Shard side: announce sleep, then re-check for work. Returns false
    /// (and stays awake) when `has_work` finds some.
    pub(crate) fn prepare_sleep(&self, has_work: impl FnOnce() -> bool) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if has_work() {
            self.sleeping.store(false, Ordering::Relaxed);
            return false;
        }
        self.asleep_since.store(u64::try_from(ORIGIN.elapsed().as_nanos()).unwrap_or(NEVER), Ordering::Relaxed);
        true
    }

    /// Wakes the shard's own sleeping task from its own thread (a glommio
    /// shard's background task that found a selection waiting).
    pub(crate) fn ring_here(&self) {
        if self.sleeping.load(Ordering::Relaxed) {
            self.rung.store(true, Ordering::Release);
            self.waker.wake();
        }
    }

    /// Async side of `sleep_blocking`, for a task on an executor: resolves
    /// once rung. A producer on another thread wakes the task through the
    /// executor's own cross-thread wake-up (glommio: its eventfd).
    pub(crate) async fn rung(&self) {
        std::future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            if self.rung.load(Ordering::Acquire) { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
        })
        .await
    }

    /// The shard's glommio thread starts (`Some`) or stops (`None`) sleeping here.
    pub(crate) fn set_thread(&self, thread: Option<u64>) {
        *self.thread.lock().unwrap_or_else(PoisonError::into_inner) = thread;
    }

    /// Runs `f` on the registered thread, if any, while it cannot go.
    pub(crate) fn with_thread(&self, f: impl FnOnce(u64)) {
        if let Some(thread) = *self.thread.lock().unwrap_or_else(PoisonError::into_inner) {
            f(thread);
        }
    }

    /// Asleep for at least `for_at_least` without waking: a glommio shard
    /// never sleeps longer than its re-check timer, so beyond that its
    /// wake-up (a producer's ring or the timer) was lost.
    pub(crate) fn asleep_for(&self, for_at_least: Duration) -> bool {
        if !self.sleeping.load(Ordering::Relaxed) {
            return false;
        }
        let since = self.asleep_since.load(Ordering::Relaxed);
        let now = u64::try_from(ORIGIN.elapsed().as_nanos()).unwrap_or(NEVER);
        since != NEVER && now.saturating_sub(since) >= u64::try_from(for_at_least.as_nanos()).unwrap_or(NEVER)
    }

    /// Resets the flags; returns when the shard was rung, if it was.
    pub(crate) fn woke(&self) -> Option<Instant> {
        self.sleeping.store(false, Ordering::Relaxed);
        self.asleep_since.store(NEVER, Ordering::Relaxed);
        self.rung.store(false, Ordering::Relaxed);
        match self.rung_at.swap(NEVER, Ordering::Relaxed) {
            NEVER => None,
            nanos => Some(*ORIGIN + std::time::Duration::from_nanos(nanos)),
        }
    }

    /// Parks the calling thread until rung or `deadline`; returns when it
    /// was rung (`None` when the deadline woke it).
    pub(crate) fn sleep_blocking(&self, deadline: Option<Instant>) -> Option<Instant> {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        loop {
            // `wake` takes the registered waker: a late ring from an earlier
            // cycle can consume it and unpark us spuriously, so register
            // again before every park or the next ring finds no one to wake.
            self.waker.register(&waker);
            if self.rung.load(Ordering::Acquire) {
                break;
            }
            match deadline {
                None => std::thread::park(),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    std::thread::park_timeout(deadline - now);
                }
            }
        }
        self.woke()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_ring_wakes_a_parked_thread() {
        let bell = Arc::new(Doorbell::default());
        let sleeper = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                assert!(bell.prepare_sleep(|| false));
                bell.sleep_blocking(None);
            })
        };
        // Ring until the sleeper has announced itself and left.
        while !sleeper.is_finished() {
            bell.ring();
            std::thread::sleep(Duration::from_millis(1));
        }
        sleeper.join().unwrap();
    }

    #[test]
    fn found_work_cancels_sleep_and_deadlines_end_it() {
        let bell = Doorbell::default();
        assert!(!bell.prepare_sleep(|| true));
        assert!(bell.prepare_sleep(|| false));
        bell.sleep_blocking(Some(Instant::now() + Duration::from_millis(5)));
        assert!(!bell.sleeping.load(Ordering::Relaxed));
    }
}
