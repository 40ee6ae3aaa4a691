//! A shard as a glommio executor doing executor work, rather than one
//! blocking loop that glommio merely pins:
//!
//! - **selections** (every command but KV events: candidates, one-visit
//!   picks, bookings, posted changes, queries) run on a latency-sensitive
//!   task queue with most of the shares;
//! - **KV events** run on a throughput queue in slices of at most
//!   `FAIR_SHARE` per ring, and give way whenever a selection waits at a
//!   ring head, so a burst of events from the ingest never holds up a pick
//!   for more than one slice;
//! - **leases** expire on a glommio timer set for the next lease end, on
//!   the same throughput queue.
//!
//! Before it sleeps, the selection task polls the rings for the spin
//! policy's budget, as the std loop does (producers then see the shard
//! awake and need not wake it). Producers wake the sleeping selection
//! task through the doorbell's waker, which glommio turns into a
//! cross-thread wake-up of its own (its eventfd). Each ring is still drained from its head only, so
//! what one producer pushed is handled in the order it pushed it, as on
//! the std-thread shard; what differs is only that a selection may now run
//! before KV events still queued in another producer's ring.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::future;
use glommio::sync::Semaphore;
use glommio::{Latency, Shares};

use super::shard_loop::ShardLoop;

/// Shares of the selection queue against the background queue's: when
/// both have work, selections get ~10× the CPU.
const SELECTION_SHARES: usize = 1000;
const BACKGROUND_SHARES: usize = 100;
/// How soon glommio should let the selection queue run once it has work.
const SELECTION_LATENCY: Duration = Duration::from_micros(100);
/// Longest sleep of the lease timer when no lease end is known (no
/// bookings, or a manual clock): it then only re-checks.
const LEASE_RECHECK: Duration = Duration::from_secs(1);
/// Longest sleep of the selection task. A producer's wake-up should end
/// every sleep, but under CPU contention one in about ten runs of the
/// concurrent-producers test lost one inside the cross-thread wake-up
/// (both shards asleep in io_uring with commands in their rings; cause not
/// found). The task re-checks its rings this often, so such a loss costs a
/// pick at most this long instead of hanging it.
const SELECTION_RECHECK: Duration = Duration::from_millis(5);

type State = Rc<RefCell<ShardLoop>>;

/// The shard's tasks, on the executor this is awaited in; returns once the
/// shard is stopped and its rings are drained.
pub(crate) async fn run(shard_loop: ShardLoop) {
    let executor = glommio::executor();
    let selections =
        executor.create_task_queue(Shares::Static(SELECTION_SHARES), Latency::Matters(SELECTION_LATENCY), "selections");
    let background = executor.create_task_queue(Shares::Static(BACKGROUND_SHARES), Latency::NotImportant, "background");
    let state: State = Rc::new(RefCell::new(shard_loop));
    let shared = state.borrow().shared_arc();
    shared.doorbell.set_thread(Some(super::nudge::current_thread()));
    let events_waiting = Rc::new(Semaphore::new(0));
    // Dropping a glommio task cancels it: the two background tasks live
    // exactly as long as the selection task.
    let events = glommio::spawn_local_into(apply_events(state.clone(), events_waiting.clone()), background)
        .expect("a task queue of this executor");
    let leases =
        glommio::spawn_local_into(expire_leases(state.clone()), background).expect("a task queue of this executor");
    glommio::spawn_local_into(serve_selections(state.clone(), events_waiting), selections)
        .expect("a task queue of this executor")
        .await;
    drop((events, leases));
    state.borrow_mut().finish();
    shared.doorbell.set_thread(None);
}

/// Runs every command but KV events; sleeps on the doorbell when there are
/// none, waking for the posted-change drain while bookings are held.
async fn serve_selections(state: State, events_waiting: Rc<Semaphore>) {
    // Held apart from the loop: no borrow of it may live across an await.
    let shared = state.borrow().shared_arc();
    loop {
        shared.beat();
        let (handled, events) = {
            let mut shard = state.borrow_mut();
            (shard.pass_selections(), shard.has_event_work())
        };
        if events {
            events_waiting.signal(1);
        }
        if handled > 0 {
            glommio::yield_if_needed().await;
            continue;
        }
        let since = Instant::now();
        let drain = {
            let mut shard = state.borrow_mut();
            shard.expire_due();
            if shard.shared().stopping() && !shard.has_selection_work() {
                return;
            }
            // Spin only when no events wait: they would end the spin at
            // once, and their task needs the thread.
            if !events && shard.spin_before_sleep(since) {
                continue;
            }
            let ready = || shard.has_selection_work() || shard.shared().stopping();
            if !shard.shared().doorbell.prepare_sleep(ready) {
                continue;
            }
            shard.posted_drain_due()
        };
        let doorbell = &shared.doorbell;
        let due = drain.map_or(SELECTION_RECHECK, |d| d.min(SELECTION_RECHECK));
        future::or(doorbell.rung(), glommio::timer::sleep(due)).await;
        let at = doorbell.woke().unwrap_or_else(Instant::now);
        state.borrow_mut().work_arrived(since, at);
    }
}

/// Applies KV events a slice at a time, giving way to any selection that
/// arrives meanwhile.
async fn apply_events(state: State, events_waiting: Rc<Semaphore>) {
    loop {
        if events_waiting.acquire(1).await.is_err() {
            return;
        }
        loop {
            let (applied, selection_waiting) = {
                let mut shard = state.borrow_mut();
                (shard.pass_events(), shard.has_selection_work())
            };
            if selection_waiting {
                // Pushed while the selection task was asleep and the
                // producer saw it awake: wake it here, then let its
                // queue run.
                state.borrow().shared().doorbell.ring_here();
                glommio::executor().yield_task_queue_now().await;
            } else if applied == 0 {
                break;
            } else {
                glommio::yield_if_needed().await;
            }
        }
    }
}

/// Frees bookings whose lease ended, on a timer set for the next end.
async fn expire_leases(state: State) {
    loop {
        let wait = {
            let mut shard = state.borrow_mut();
            shard.expire_due();
            shard.until_next_lease_end().map_or(LEASE_RECHECK, |d| d.min(LEASE_RECHECK))
        };
        glommio::timer::sleep(wait.max(Duration::from_millis(1))).await;
    }
}
