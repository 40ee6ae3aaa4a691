//! Warm start (issue #22): a subscription opened before its worker's index
//! arrives from a peer replica is *held*: live batches are kept, nothing
//! is applied or asked for. The peer's export is the worker's index after
//! its batch `S` (stamped `ts_S`); the seed sets the stream there and
//! replays what was held:
//!
//! - a held batch numbered `≤ S` and stamped no later than `ts_S` is in
//!   the export already: a duplicate, dropped (applying it again could
//!   bring back a block removed since, or drop one stored again);
//! - one numbered `≤ S` but stamped later is a restarted engine's (its
//!   counter went back to 0 after the cut): the worker is cleared and it
//!   starts a new run, as on the live stream;
//! - `S + 1` applies, and past it the usual gap rules hold (a replay from
//!   `S + 1`, or a loss without a replay endpoint).
//!
//! A batch with no stamp cannot be told from a restart's; it is taken for
//! a duplicate, the common case (the subscription opened before the
//! peer's cut). Without a seed (no peer, a timeout, the hold buffer full),
//! the release starts the subscription exactly as an unheld one starts.

use std::collections::VecDeque;

use super::{Sequencer, Step};

impl<P> Sequencer<P> {
    /// Holds the stream for a seed; only before anything was applied or
    /// asked for (false otherwise, nothing changed).
    pub fn hold(&mut self) -> bool {
        if self.last.is_some() || self.pending.is_some() || self.held.is_some() {
            return false;
        }
        self.held = Some(VecDeque::new());
        true
    }

    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Continues from batch `last` (stamped `last_stamp`), as a peer's
    /// export of the worker left it; the held batches are handled as the
    /// module docs say. False, and nothing changed, when not held (a seed
    /// that came too late: the stream started on its own).
    pub fn seed(&mut self, last: u64, last_stamp: Option<f64>, out: &mut Vec<Step<P>>) -> bool {
        // Nothing is numbered after the end marker's number.
        if last == u64::MAX {
            return false;
        }
        let Some(held) = self.held.take() else { return false };
        self.last = Some(last);
        self.last_stamp = last_stamp;
        // The connection dropped while held: the engine may have restarted
        // in place and gone past `last` meanwhile. Its history from 0 tells
        // (an answer from 0 rebuilds the worker; a later one is a gap).
        if std::mem::take(&mut self.dropped_while_held) {
            self.reconnected(out);
        }
        let mut restarted = false;
        for (seq, payload) in held {
            let covered = !restarted
                && seq <= last
                && match ((self.stamp)(&payload), last_stamp) {
                    (Some(stamp), Some(cut)) => stamp <= cut,
                    _ => true,
                };
            if covered {
                out.push(Step::Duplicate { seq });
                continue;
            }
            if !restarted && seq <= last {
                // Stamped after the cut yet numbered before it: a new run.
                restarted = true;
                out.push(Step::Clear);
                self.last = None;
                self.last_stamp = None;
            }
            self.live(seq, payload, out);
        }
        true
    }

    /// Gives up the hold: the held batches, then the stream, go on as if
    /// the subscription had just opened (a catch-up replay when nothing
    /// was held). Nothing happens when not held.
    pub fn release(&mut self, out: &mut Vec<Step<P>>) {
        let Some(held) = self.held.take() else { return };
        // Nothing applied yet: the catch-up below covers a drop.
        self.dropped_while_held = false;
        if held.is_empty() {
            return self.catch_up(out);
        }
        for (seq, payload) in held {
            self.live(seq, payload, out);
        }
    }

    /// Where the stream stands, for an export of the worker: the last
    /// batch applied and its stamp. `None` while a replay is in flight or
    /// the stream is held (the index is not at one batch's end then).
    pub fn cut(&self) -> Option<(u64, Option<f64>)> {
        if self.pending.is_some() || self.held.is_some() {
            return None;
        }
        Some((self.last?, self.last_stamp))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LossCause, ReplayEnd, ReplayKind};
    use super::*;

    /// Payloads are stamps; each test says which batch carries which.
    fn stamped(can_replay: bool) -> Sequencer<f64> {
        Sequencer::new(can_replay, 4).with_stamps(|stamp| Some(*stamp))
    }

    fn feed(s: &mut Sequencer<f64>, batches: &[(u64, f64)]) -> Vec<Step<f64>> {
        let mut out = Vec::new();
        for &(seq, stamp) in batches {
            s.live(seq, stamp, &mut out);
        }
        out
    }

    fn seeded(s: &mut Sequencer<f64>, last: u64, stamp: f64) -> Vec<Step<f64>> {
        let mut out = Vec::new();
        assert!(s.seed(last, Some(stamp), &mut out));
        out
    }

    fn apply(seq: u64, stamp: f64) -> Step<f64> {
        Step::Apply { seq, payload: stamp, replayed: false }
    }

    #[test]
    fn held_batches_the_export_covers_are_dropped_and_the_rest_applied() {
        let mut s = stamped(true);
        assert!(s.hold());
        assert!(feed(&mut s, &[(5, 5.0), (6, 6.0), (7, 7.0)]).is_empty(), "a held stream applies nothing");
        let mut out = Vec::new();
        s.catch_up(&mut out);
        assert!(out.is_empty(), "a held stream asks for nothing");
        assert_eq!(s.cut(), None);
        let out = seeded(&mut s, 6, 6.0);
        assert_eq!(out, vec![Step::Duplicate { seq: 5 }, Step::Duplicate { seq: 6 }, apply(7, 7.0)]);
        assert_eq!(feed(&mut s, &[(8, 8.0)]), vec![apply(8, 8.0)]);
        assert_eq!(s.cut(), Some((8, Some(8.0))));
    }

    #[test]
    fn a_gap_after_the_cut_is_replayed_or_lost() {
        let mut s = stamped(true);
        s.hold();
        feed(&mut s, &[(9, 9.0)]);
        let out = seeded(&mut s, 6, 6.0);
        assert_eq!(out, vec![Step::Gap { from: 7, to: 8 }, Step::Replay { from: 7, kind: ReplayKind::Gap }]);
        let mut out = Vec::new();
        s.replayed(7, 7.0, &mut out);
        s.replayed(8, 8.0, &mut out);
        s.end_replay(ReplayEnd::Completed, &mut out);
        assert_eq!(
            out,
            vec![
                Step::Apply { seq: 7, payload: 7.0, replayed: true },
                Step::Apply { seq: 8, payload: 8.0, replayed: true },
                apply(9, 9.0)
            ]
        );

        let mut s = stamped(false);
        s.hold();
        feed(&mut s, &[(9, 9.0)]);
        let out = seeded(&mut s, 6, 6.0);
        assert_eq!(
            out,
            vec![
                Step::Gap { from: 7, to: 8 },
                Step::Lost { from: 7, to: 8, cause: LossCause::NoReplayEndpoint },
                apply(9, 9.0)
            ]
        );
    }

    #[test]
    fn a_batch_numbered_before_the_cut_but_stamped_after_it_is_a_restart() {
        // The engine restarted after the peer's cut: its new run's batch 0
        // and 1 are stamped later. The imported index is cleared.
        let mut s = stamped(false);
        s.hold();
        feed(&mut s, &[(6, 6.0), (0, 20.0), (1, 21.0)]);
        let out = seeded(&mut s, 6, 6.0);
        assert_eq!(out, vec![Step::Duplicate { seq: 6 }, Step::Clear, apply(0, 20.0), apply(1, 21.0)]);
        // With a replay endpoint, a new run past 0 relearns from 0.
        let mut s = stamped(true);
        s.hold();
        feed(&mut s, &[(3, 20.0)]);
        let out = seeded(&mut s, 6, 6.0);
        assert_eq!(out, vec![Step::Clear, Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);
    }

    #[test]
    fn without_a_seed_the_release_starts_the_stream_as_if_never_held() {
        let mut s = stamped(true);
        s.hold();
        let mut out = Vec::new();
        s.release(&mut out);
        assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);

        let mut s = stamped(true);
        s.hold();
        feed(&mut s, &[(5, 5.0)]);
        let mut out = Vec::new();
        s.release(&mut out);
        assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);
        // A seed after the release is too late.
        assert!(!s.seed(9, Some(9.0), &mut Vec::new()));
        assert!(!s.is_held());
    }

    #[test]
    fn a_full_hold_releases_itself_and_refuses_a_late_seed() {
        let mut s = stamped(false);
        s.hold();
        let out = feed(&mut s, &[(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]);
        assert!(out.is_empty());
        // The fifth is one more than the hold keeps: released, cold.
        let out = feed(&mut s, &[(4, 4.0)]);
        assert_eq!(out, (0..5).map(|seq| apply(seq, seq as f64)).collect::<Vec<_>>());
        assert!(!s.seed(2, Some(2.0), &mut Vec::new()));
        assert!(!s.hold(), "a started stream is not held again");
    }

    #[test]
    fn a_drop_while_held_makes_the_seed_ask_for_the_history() {
        let mut s = stamped(true);
        s.hold();
        let mut out = Vec::new();
        s.reconnected(&mut out);
        assert!(out.is_empty());
        feed(&mut s, &[(7, 7.0)]);
        let out = seeded(&mut s, 6, 6.0);
        // Asked from 0 before anything is applied; 7 waits for the answer.
        assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::Reconnect }]);
        let mut out = Vec::new();
        s.replayed(5, 5.0, &mut out);
        s.replayed(6, 6.0, &mut out);
        s.replayed(7, 7.0, &mut out);
        s.end_replay(ReplayEnd::Completed, &mut out);
        // A long-lived engine (its answer starts past 0): what follows the
        // cut is asked for, then applied once.
        assert_eq!(out[0], Step::Replay { from: 7, kind: ReplayKind::Gap });
        assert!(!s.seed(u64::MAX, None, &mut Vec::new()), "seeded twice");
    }

    #[test]
    fn a_batch_without_a_stamp_before_the_cut_is_taken_as_covered() {
        let mut s: Sequencer<f64> = Sequencer::new(false, 4);
        s.hold();
        feed(&mut s, &[(4, 0.0), (5, 0.0)]);
        let mut out = Vec::new();
        assert!(s.seed(4, None, &mut out));
        assert_eq!(out, vec![Step::Duplicate { seq: 4 }, apply(5, 0.0)]);
    }
}
