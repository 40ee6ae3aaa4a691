//! Interrupting a glommio shard's sleep from another thread.
//!
//! Under CPU contention a glommio executor can sleep in `io_uring_enter`
//! with neither its cross-thread wake-up (the eventfd a producer's ring
//! writes) nor its own timer ending the sleep: both shards of the
//! concurrent-producers test were seen asleep for minutes with commands in
//! their rings, until a debugger's attach (a signal) woke them. The cause is
//! inside glommio 0.9; what ends such a sleep is a signal, which makes
//! `io_uring_enter` return `EINTR` and the executor poll again. A glommio
//! shard's selection task never sleeps longer than its 5 ms re-check
//! timer and counts a heartbeat each pass, so a watchdog thread looks,
//! every [`WATCH_EVERY`], for a shard whose heartbeat has not moved for
//! [`STALLED_AFTER`] or that is asleep on its doorbell longer than
//! [`WATCH_EVERY`] (rung or not: a lost timer strands posted frees and
//! queue deadlines too), and sends its thread SIGURG, whose handler does
//! nothing. The heartbeat catches what the doorbell cannot: a stall seen
//! in the concurrent-producers test under two CPU hogs had both shards in
//! `io_uring_enter` with their selection tasks not asleep on the doorbell
//! (no nudge was sent in minutes) and ended at a debugger's attach. SIGURG: its default is to be ignored (an
//! ignored signal would interrupt nothing, hence the handler), nothing in
//! kvpick uses it, and it is sent to one thread only.

use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::producer::RingCounters;
use super::shard_loop::ShardShared;

/// How often the watchdog looks, and how long a shard may sleep before its
/// thread is interrupted (twice the shard's re-check timer).
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(10);
/// No heartbeat for this long (four re-check periods): the shard is stuck,
/// or its thread has not run (a nudge is then harmless).
pub(crate) const STALLED_AFTER: Duration = Duration::from_millis(20);

extern "C" fn ignore(_: libc::c_int) {}

/// Installs the no-op SIGURG handler, once per process, without
/// `SA_RESTART`, so that a blocking call in the signalled thread returns.
fn install_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed `sigaction` is valid (empty mask, no flags); the
        // handler is an `extern "C" fn(c_int)` that touches nothing, so it
        // is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGURG, &action, std::ptr::null_mut()) != 0 {
                tracing::warn!(error = %std::io::Error::last_os_error(), "no SIGURG handler: a stuck glommio shard cannot be nudged");
            }
        }
    });
}

/// The calling thread, as the watchdog will signal it.
pub(crate) fn current_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// Watches glommio shards until every one has exited, counting the nudges
/// it sends.
pub(crate) fn spawn_watchdog(shards: Vec<Arc<ShardShared>>, counters: Arc<RingCounters>) -> std::io::Result<()> {
    install_handler();
    std::thread::Builder::new().name("kvpick-glommio-watchdog".into()).spawn(move || {
        // Each shard's last heartbeat, and when it was first seen.
        let mut seen: Vec<(u64, Instant)> = shards.iter().map(|s| (s.heartbeat(), Instant::now())).collect();
        while !shards.iter().all(|s| s.exited()) {
            std::thread::sleep(WATCH_EVERY);
            let now = Instant::now();
            for (i, shard) in shards.iter().enumerate() {
                let beat = shard.heartbeat();
                if beat != seen[i].0 {
                    seen[i] = (beat, now);
                }
                let stalled = now.duration_since(seen[i].1) >= STALLED_AFTER && !shard.exited();
                if !stalled && !shard.doorbell.asleep_for(WATCH_EVERY) {
                    continue;
                }
                shard.doorbell.with_thread(|thread| {
                    // SAFETY: the id is registered only while its glommio
                    // thread runs the shard, and cannot be unregistered
                    // while `with_thread` holds it; SIGURG has a handler.
                    let sent = unsafe { libc::pthread_kill(thread as libc::pthread_t, libc::SIGURG) };
                    if sent == 0 {
                        counters.glommio_nudges.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(shard = i, "a sleeping glommio shard missed its wake-up: nudged");
                    }
                });
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doorbell::Doorbell;

    #[test]
    fn sigurg_interrupts_a_blocking_call_in_the_signalled_thread() {
        install_handler();
        let (tx, rx) = std::sync::mpsc::channel();
        let blocked = std::thread::spawn(move || {
            let mut fds = [0; 2];
            // SAFETY: a pipe nobody writes to: `read` blocks until a signal.
            unsafe {
                assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
                tx.send(current_thread()).unwrap();
                let mut byte = 0u8;
                let n = libc::read(fds[0], (&mut byte as *mut u8).cast(), 1);
                let error = std::io::Error::last_os_error();
                libc::close(fds[0]);
                libc::close(fds[1]);
                (n, error.raw_os_error())
            }
        });
        let thread = rx.recv().unwrap();
        // The read may not have started yet: signal until it returns.
        while !blocked.is_finished() {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: the thread is alive until `is_finished`; joined below.
            unsafe { libc::pthread_kill(thread as libc::pthread_t, libc::SIGURG) };
        }
        assert_eq!(blocked.join().unwrap(), (-1, Some(libc::EINTR)));
    }

    #[test]
    fn only_a_sleep_longer_than_the_watch_counts_as_lost() {
        let bell = Doorbell::default();
        assert!(!bell.asleep_for(Duration::ZERO), "never slept");
        assert!(bell.prepare_sleep(|| false));
        assert!(!bell.asleep_for(Duration::from_secs(60)), "asleep just now");
        std::thread::sleep(Duration::from_millis(15));
        assert!(bell.asleep_for(Duration::from_millis(10)));
        bell.woke();
        assert!(!bell.asleep_for(Duration::ZERO), "awake");
        // A sleep refused because work was waiting is no sleep.
        assert!(!bell.prepare_sleep(|| true));
        assert!(!bell.asleep_for(Duration::ZERO));
    }
}
