//! Per-publisher ordering of KV-event batches by sequence number.
//!
//! Pure bookkeeping, no sockets: the caller feeds it live and replayed
//! batches and executes the [`Step`]s it emits, in order. Invariant: batches
//! are applied in strictly increasing sequence order per publisher, except
//! right after an engine restart ([`Step::Clear`]), which starts a new run.
//!
//! - `seq == last + 1`: applied.
//! - `seq > last + 1`: a gap. With a replay endpoint, a replay from
//!   `last + 1` starts and live batches are buffered until it ends; replayed
//!   batches are applied in order and buffered ones already covered are
//!   dropped as duplicates. Without one, the gap is lost and `seq` applied.
//! - `seq <= last`: the engine restarted (its counter starts at 0 again;
//!   PUB never sends a batch twice, so the same number again is a restart):
//!   its index is cleared and `seq` handled as a first batch. Among batches
//!   buffered during a replay, only the live stream going back counts: one
//!   at or below `last` because the replay already applied it is a
//!   duplicate.
//! - Except a late batch: at most [`LATE_WINDOW`] behind `last` and stamped
//!   no later than the last batch applied (each batch carries its engine's
//!   wall-clock `ts`). A restarted engine's batches are stamped after
//!   everything its old run sent, so this is a batch overtaken on the way,
//!   not a new run: it is dropped ([`Step::Late`]). Its number was already
//!   handled: the batch that overtook it opened a gap replay, which applied
//!   it from the engine's buffer or reported it lost. Clearing the worker
//!   for it would forget a cache the engine still holds. Only with stamps
//!   ([`Sequencer::with_stamps`]); without, the rule above holds.
//! - On subscribing, and on a first batch (after connecting, or a restart)
//!   with `seq > 0`: a catch-up replay from 0 relearns what the engine's
//!   replay buffer still holds.
//!   What predates the buffer was never ours to lose, so a catch-up never
//!   reports loss; a gap replay reports whatever it could not heal.

use std::collections::VecDeque;

/// How far behind the last batch applied a batch may be and still count
/// as late rather than as a restart's (given its stamp): batches overtaken
/// on the way are a few behind. The bound keeps an engine restarted with
/// its clock stepped back from passing for a late batch for long: past
/// this many batches, its new run is taken for one.
pub const LATE_WINDOW: u64 = 64;

/// What the caller must do, in emission order.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<P> {
    /// Decode the batch and apply its events.
    Apply { seq: u64, payload: P, replayed: bool },
    /// The engine restarted: clear the worker's index and per-publisher
    /// decoder state before applying anything after this step.
    Clear,
    /// Batches `from..=to` went missing on the live stream.
    Gap { from: u64, to: u64 },
    /// Batches `from..=to` will never be applied.
    Lost { from: u64, to: u64, cause: LossCause },
    /// Open a replay from `from` (replacing any replay in flight).
    Replay { from: u64, kind: ReplayKind },
    /// Close the replay in flight: it is given up.
    AbandonReplay,
    /// Batch `seq` was already applied; dropped.
    Duplicate { seq: u64 },
    /// Batch `seq` arrived after a later one (overtaken on the way, not a
    /// restart); dropped: its gap was healed or reported lost already.
    Late { seq: u64 },
    /// Clear the worker's index: a reconnect's answer holds the engine's
    /// whole history, which is applied next.
    Rebuild,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// The publisher has no replay endpoint.
    NoReplayEndpoint,
    /// The replay failed, timed out, or buffered too much live traffic.
    ReplayFailed,
    /// The replay ran, but the engine's buffer no longer held these.
    NotInReplayBuffer,
}

/// How a replay ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayEnd {
    /// The end marker arrived.
    Completed,
    /// Timed out, socket error, or too much live traffic buffered.
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayKind {
    /// Heal a gap in the live stream.
    Gap,
    /// Relearn history from 0 on a first batch with `seq > 0`.
    CatchUp,
    /// After the live connection dropped and came back: the engine may have
    /// restarted in place meanwhile and published past the old sequence
    /// number, so `seq < last` cannot tell. Asked from 0: an answer that
    /// starts at 0 holds the engine's whole history and the worker is
    /// rebuilt from it ([`Step::Rebuild`]); one that starts later is a
    /// long-lived engine (a restarted one starts at 0), healed as a gap.
    Reconnect,
}

#[derive(Debug)]
struct Pending<P> {
    kind: ReplayKind,
    from: u64,
    /// Live batches received meanwhile, in arrival order; the first is the
    /// batch that triggered the replay, except for a catch-up asked on
    /// subscribing ([`Sequencer::catch_up`]), which starts empty.
    buffered: VecDeque<(u64, P)>,
    /// Whether the current answer (since the last request) has applied a
    /// batch: a jump after that is a hole dropped on the way, not the
    /// start of what the engine still holds.
    answered: bool,
    /// Times it was asked again after going quiet without applying a
    /// batch since the last one applied (or since it began): the caller
    /// gives up after so many ([`Sequencer::silent_replays`]).
    silent: u32,
}

impl<P> Pending<P> {
    fn new(kind: ReplayKind, from: u64, buffered: VecDeque<(u64, P)>) -> Self {
        Pending { kind, from, buffered, answered: false, silent: 0 }
    }
}

#[derive(Debug)]
pub struct Sequencer<P> {
    last: Option<u64>,
    /// Stamp of the last batch applied, when it had one.
    last_stamp: Option<f64>,
    /// Reads a batch's stamp (the engine's wall-clock `ts`).
    stamp: fn(&P) -> Option<f64>,
    pending: Option<Pending<P>>,
    /// Held for a seed (warm start, see `hold`): live batches kept here,
    /// nothing applied or asked for until the seed or the release.
    held: Option<VecDeque<(u64, P)>>,
    /// The connection dropped and came back while held: the seed asks the
    /// engine for its history, as a reconnect does.
    dropped_while_held: bool,
    can_replay: bool,
    buffer_limit: usize,
}

impl<P> Sequencer<P> {
    /// `buffer_limit`: most live batches held during a replay; one more
    /// abandons the replay (a stuck replay must not grow memory forever).
    pub fn new(can_replay: bool, buffer_limit: usize) -> Self {
        Sequencer {
            last: None,
            last_stamp: None,
            stamp: |_| None,
            pending: None,
            held: None,
            dropped_while_held: false,
            can_replay,
            buffer_limit: buffer_limit.max(1),
        }
    }

    /// Reads each batch's stamp with `stamp`, so that a late batch is told
    /// from a restart (see the module docs).
    pub fn with_stamps(self, stamp: fn(&P) -> Option<f64>) -> Self {
        Sequencer { stamp, ..self }
    }

    /// Sequence number of the last batch applied in this run.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    #[cfg(test)]
    pub fn replaying(&self) -> Option<ReplayKind> {
        self.pending.as_ref().map(|p| p.kind)
    }

    pub fn live(&mut self, seq: u64, payload: P, out: &mut Vec<Step<P>>) {
        if let Some(held) = &mut self.held {
            if held.len() < self.buffer_limit {
                held.push_back((seq, payload));
                return;
            }
            // Held too long: the seed is given up, and this subscription
            // starts as it would have without one.
            self.release(out);
            return self.live(seq, payload, out);
        }
        if let Some(pending) = &mut self.pending {
            if pending.buffered.len() < self.buffer_limit {
                pending.buffered.push_back((seq, payload));
                return;
            }
            out.push(Step::AbandonReplay);
            self.end_replay(ReplayEnd::Failed, out);
            // The drain may have started another replay; go round again.
            return self.live(seq, payload, out);
        }
        let Some(last) = self.last else {
            if seq == 0 || !self.can_replay {
                return self.apply(seq, payload, false, out);
            }
            return self.start_replay(ReplayKind::CatchUp, 0, seq, payload, out);
        };
        // PUB never sends a batch twice: the same number again is a new run
        // too (an engine restarted after publishing only batch 0 sends 0
        // again; taken for a duplicate, its run was never learned).
        if seq <= last {
            if self.late(seq, last, &payload) {
                return out.push(Step::Late { seq });
            }
            out.push(Step::Clear);
            self.last = None;
            self.live(seq, payload, out);
        } else if seq == last + 1 {
            self.apply(seq, payload, false, out);
        } else {
            out.push(Step::Gap { from: last + 1, to: seq - 1 });
            if self.can_replay {
                self.start_replay(ReplayKind::Gap, last + 1, seq, payload, out);
            } else {
                out.push(Step::Lost { from: last + 1, to: seq - 1, cause: LossCause::NoReplayEndpoint });
                self.apply(seq, payload, false, out);
            }
        }
    }

    /// A batch from the replay in flight (ignored when none is).
    ///
    /// An answer streams the engine's buffer in order, so only its first
    /// batch may start past `expected` (what the engine no longer holds: a
    /// loss for a gap, history before the buffer for a catch-up). A jump
    /// later in the answer is a hole: batches dropped on the way (vLLM's
    /// replay ROUTER drops what overflows its send high-water mark). The
    /// engine still holds them, so the replay is asked again from the hole
    /// and this batch waits for the new answer.
    pub fn replayed(&mut self, seq: u64, payload: P, out: &mut Vec<Step<P>>) {
        let Some(pending) = &mut self.pending else { return };
        if pending.kind == ReplayKind::Reconnect {
            if seq == 0 {
                out.push(Step::Rebuild);
                self.last = None;
                pending.kind = ReplayKind::CatchUp;
            } else {
                // The same long-lived engine: only what follows `last` is
                // news. Its answer from its buffer's start would mostly be
                // duplicates (and overflow its ROUTER first): ask for the rest.
                let from = self.last.map_or(0, |last| last + 1);
                (pending.kind, pending.from) = (ReplayKind::Gap, from);
                if seq < from {
                    pending.answered = false;
                    out.push(Step::Replay { from, kind: ReplayKind::Gap });
                    return;
                }
            }
        }
        let expected = self.last.map_or(pending.from, |last| last + 1);
        if seq < expected {
            out.push(Step::Duplicate { seq });
            return;
        }
        if seq > expected {
            if pending.answered {
                pending.answered = false;
                out.push(Step::Replay { from: expected, kind: pending.kind });
                return;
            }
            if pending.kind == ReplayKind::Gap {
                out.push(Step::Lost { from: expected, to: seq - 1, cause: LossCause::NotInReplayBuffer });
            }
        }
        pending.answered = true;
        pending.silent = 0;
        self.apply(seq, payload, true, out);
    }

    /// On subscribing: relearn what the engine's replay buffer holds now,
    /// without waiting for a live batch. A worker nobody routes to (after
    /// kvpick or the worker's entry restarts, its cache looks empty to the
    /// index, so the picker does not favour it) may publish nothing for a
    /// long time, its cache unknown meanwhile. Nothing happens without a
    /// replay endpoint, or once a batch or a replay is under way.
    pub fn catch_up(&mut self, out: &mut Vec<Step<P>>) {
        if self.can_replay && self.last.is_none() && self.pending.is_none() && self.held.is_none() {
            out.push(Step::Replay { from: 0, kind: ReplayKind::CatchUp });
            self.pending = Some(Pending::new(ReplayKind::CatchUp, 0, VecDeque::new()));
        }
    }

    /// The live connection came back after a drop (see
    /// [`ReplayKind::Reconnect`]); the caller has handled every message of
    /// the old connection first. A replay in flight is replaced and the
    /// live batches it buffered are dropped: whether they are the old run's
    /// (the engine restarted) or the engine's own, the answer from 0 covers
    /// what matters of them.
    pub fn reconnected(&mut self, out: &mut Vec<Step<P>>) {
        // Held: the seed (or the release) decides what the batches held
        // around the drop mean; a seed then asks as a reconnect does.
        if self.held.is_some() {
            self.dropped_while_held = true;
            return;
        }
        if !self.can_replay {
            return;
        }
        if self.last.is_none() {
            // Nothing applied in this run: a catch-up from 0 says it all.
            return self.catch_up(out);
        }
        out.push(Step::Replay { from: 0, kind: ReplayKind::Reconnect });
        self.pending = Some(Pending::new(ReplayKind::Reconnect, 0, VecDeque::new()));
    }

    /// Whether the replay in flight has applied a batch since it was last
    /// asked for: a replay gone quiet after that is asked again, one
    /// without is given up.
    pub fn answered(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.answered)
    }

    /// How many times the replay in flight was asked again after going
    /// quiet without applying a batch, since the last batch it applied:
    /// the caller gives it up after as many as it allows. 0 with no replay
    /// in flight; a new replay starts at 0.
    pub fn silent_replays(&self) -> u32 {
        self.pending.as_ref().map_or(0, |p| p.silent)
    }

    /// The replay in flight went quiet. After applying batches its answer
    /// was cut short, as vLLM's can be (its replay ROUTER keeps ZMQ's
    /// default send high-water mark of 1,000 messages and silently drops
    /// what overflows it, end marker included); without, the engine's
    /// replay socket was down or the request lost, and the caller decides
    /// how often that is worth asking again. Asks again from the first
    /// batch still missing (a reconnect's, unanswered, from 0 again); the
    /// live batches buffered meanwhile stay. Nothing happens with no
    /// replay in flight.
    pub fn resume_replay(&mut self, out: &mut Vec<Step<P>>) {
        if let Some(pending) = &mut self.pending {
            if !pending.answered {
                pending.silent += 1;
            }
            let from = match pending.kind {
                // Still unanswered (an answer turns it into a gap or a
                // catch-up): asked from `last` it could not tell a restart.
                ReplayKind::Reconnect => pending.from,
                _ => self.last.map_or(pending.from, |last| last + 1),
            };
            pending.answered = false;
            out.push(Step::Replay { from, kind: pending.kind });
        }
    }

    /// The replay in flight ended. Whatever it did not heal before the
    /// first buffered batch is lost; buffered batches are then handled as
    /// live, except those the replay already applied (duplicates).
    ///
    /// A completed answer that applied batches but stops short of the first
    /// buffered live batch lost its tail on the way (the end marker got
    /// through, the batches before it did not: the engine served the replay
    /// after publishing everything before that live batch). It is asked
    /// again from the first batch missing instead of ending.
    pub fn end_replay(&mut self, end: ReplayEnd, out: &mut Vec<Step<P>>) {
        if let (ReplayEnd::Completed, Some(pending), Some(last)) = (end, &mut self.pending, self.last) {
            let short = pending.buffered.front().is_some_and(|&(first, _)| first > last + 1);
            if pending.answered && short {
                pending.answered = false;
                out.push(Step::Replay { from: last + 1, kind: pending.kind });
                return;
            }
        }
        let Some(pending) = self.pending.take() else { return };
        if pending.kind == ReplayKind::Reconnect {
            // Not one batch came back: restarted or not cannot be told, so
            // nothing of the old run may stay. The live batches go on from
            // an empty worker (one past 0 asks for a catch-up).
            out.push(Step::Rebuild);
            self.last = None;
            for (seq, payload) in pending.buffered {
                self.live(seq, payload, out);
            }
            return;
        }
        let cause = match end {
            ReplayEnd::Completed => LossCause::NotInReplayBuffer,
            ReplayEnd::Failed => LossCause::ReplayFailed,
        };
        if let Some(&(first, _)) = pending.buffered.front() {
            let expected = self.last.map_or(pending.from, |last| last + 1);
            // `first > expected` implies `first > 0`; a restart (first below
            // `last`) is left to `live`.
            if first > expected {
                if pending.kind == ReplayKind::Gap {
                    out.push(Step::Lost { from: expected, to: first - 1, cause });
                }
                self.last = Some(first - 1);
            }
        }
        // Buffered batches the replay already applied are duplicates, not a
        // restart; only the live stream itself going back is one.
        let mut previous: Option<u64> = None;
        for (seq, payload) in pending.buffered {
            let went_back = previous.is_some_and(|previous| seq < previous);
            previous = Some(seq);
            let covered = self.pending.is_none() && self.last.is_some_and(|last| seq <= last);
            if covered && !went_back {
                out.push(Step::Duplicate { seq });
            } else {
                self.live(seq, payload, out);
            }
        }
    }

    fn start_replay(&mut self, kind: ReplayKind, from: u64, seq: u64, payload: P, out: &mut Vec<Step<P>>) {
        out.push(Step::Replay { from, kind });
        self.pending = Some(Pending::new(kind, from, VecDeque::from([(seq, payload)])));
    }

    /// Whether batch `seq`, at or behind `last`, was overtaken on the way
    /// rather than sent by a restarted engine.
    fn late(&self, seq: u64, last: u64, payload: &P) -> bool {
        let stamped_before = match ((self.stamp)(payload), self.last_stamp) {
            (Some(stamp), Some(last_stamp)) => stamp <= last_stamp,
            _ => false,
        };
        stamped_before && last - seq < LATE_WINDOW
    }

    fn apply(&mut self, seq: u64, payload: P, replayed: bool, out: &mut Vec<Step<P>>) {
        self.last = Some(seq);
        self.last_stamp = (self.stamp)(&payload);
        out.push(Step::Apply { seq, payload, replayed });
    }
}

mod hold;
#[cfg(test)]
mod tests;
