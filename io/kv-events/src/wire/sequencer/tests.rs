use super::*;

type Steps = Vec<Step<u64>>;

/// Feeds live batches whose payload is their own seq.
fn live(s: &mut Sequencer<u64>, seqs: &[u64]) -> Steps {
    let mut out = Vec::new();
    for &seq in seqs {
        s.live(seq, seq, &mut out);
    }
    out
}

fn replayed(s: &mut Sequencer<u64>, seqs: &[u64]) -> Steps {
    let mut out = Vec::new();
    for &seq in seqs {
        s.replayed(seq, seq, &mut out);
    }
    out
}

fn end(s: &mut Sequencer<u64>, end: ReplayEnd) -> Steps {
    let mut out = Vec::new();
    s.end_replay(end, &mut out);
    out
}

fn applied(steps: &Steps) -> Vec<u64> {
    steps.iter().filter_map(|s| if let Step::Apply { seq, .. } = s { Some(*seq) } else { None }).collect()
}

fn apply(seq: u64, replayed: bool) -> Step<u64> {
    Step::Apply { seq, payload: seq, replayed }
}

#[test]
fn in_order_batches_are_applied() {
    let mut s = Sequencer::new(true, 8);
    let out = live(&mut s, &[0, 1, 2]);
    assert_eq!(out, vec![apply(0, false), apply(1, false), apply(2, false)]);
    assert_eq!(s.last(), Some(2));
}

#[test]
fn the_same_number_again_on_the_live_stream_is_a_new_run() {
    // PUB never repeats a batch: an engine restarted after publishing only
    // batch 0 publishes 0 again, and that run must be learned.
    let mut s = Sequencer::new(false, 8);
    assert_eq!(live(&mut s, &[0, 0]), vec![apply(0, false), Step::Clear, apply(0, false)]);
    // With a replay endpoint, a repeat past 0 relearns the run from 0.
    let mut s = Sequencer::new(true, 8);
    let out = live(&mut s, &[0, 1, 1]);
    assert_eq!(
        out,
        vec![apply(0, false), apply(1, false), Step::Clear, Step::Replay { from: 0, kind: ReplayKind::CatchUp }]
    );
}

#[test]
fn gap_without_replay_endpoint_is_lost_and_stream_continues() {
    let mut s = Sequencer::new(false, 8);
    let out = live(&mut s, &[0, 1, 4, 5]);
    assert_eq!(
        out,
        vec![
            apply(0, false),
            apply(1, false),
            Step::Gap { from: 2, to: 3 },
            Step::Lost { from: 2, to: 3, cause: LossCause::NoReplayEndpoint },
            apply(4, false),
            apply(5, false),
        ]
    );
}

#[test]
fn gap_is_healed_by_replay_and_buffered_duplicates_dropped() {
    let mut s = Sequencer::new(true, 8);
    let mut out = live(&mut s, &[0, 1, 4]);
    assert_eq!(out[2..], [Step::Gap { from: 2, to: 3 }, Step::Replay { from: 2, kind: ReplayKind::Gap }]);
    assert_eq!(s.replaying(), Some(ReplayKind::Gap));
    out = live(&mut s, &[5, 6]);
    assert!(out.is_empty(), "buffered while replaying: {out:?}");
    out = replayed(&mut s, &[2, 3, 4, 5]);
    assert_eq!(out, vec![apply(2, true), apply(3, true), apply(4, true), apply(5, true)]);
    out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(out, vec![Step::Duplicate { seq: 4 }, Step::Duplicate { seq: 5 }, apply(6, false)]);
    assert_eq!(s.replaying(), None);
    assert_eq!(s.last(), Some(6));
}

#[test]
fn failed_replay_counts_the_unhealed_part_and_applies_the_buffer() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 5, 6]);
    let mut out = replayed(&mut s, &[1, 2]);
    assert_eq!(applied(&out), vec![1, 2]);
    out = end(&mut s, ReplayEnd::Failed);
    assert_eq!(
        out,
        vec![Step::Lost { from: 3, to: 4, cause: LossCause::ReplayFailed }, apply(5, false), apply(6, false)]
    );
}

#[test]
fn replay_starting_past_the_gap_reports_what_the_engine_no_longer_holds() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 9]);
    let out = replayed(&mut s, &[4, 5, 6, 7, 8, 9]);
    assert_eq!(out[0], Step::Lost { from: 1, to: 3, cause: LossCause::NotInReplayBuffer });
    assert_eq!(applied(&out), vec![4, 5, 6, 7, 8, 9]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![Step::Duplicate { seq: 9 }]);
}

#[test]
fn empty_replay_loses_the_gap_once_and_does_not_replay_again() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 3]);
    let out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(out, vec![Step::Lost { from: 1, to: 2, cause: LossCause::NotInReplayBuffer }, apply(3, false)]);
    assert_eq!(s.replaying(), None);
}

#[test]
fn lower_seq_means_restart_clears_and_starts_over() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1, 2]);
    let out = live(&mut s, &[0, 1]);
    assert_eq!(out, vec![Step::Clear, apply(0, false), apply(1, false)]);
}

#[test]
fn restart_first_seen_past_zero_catches_up() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1, 2, 3]);
    let out = live(&mut s, &[2]);
    assert_eq!(out, vec![Step::Clear, Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);
}

#[test]
fn first_batch_past_zero_catches_up_from_zero_without_loss() {
    let mut s = Sequencer::new(true, 8);
    let mut out = live(&mut s, &[7]);
    assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);
    // The engine's buffer starts at 5: nothing before it counts as lost.
    out = replayed(&mut s, &[5, 6, 7]);
    assert_eq!(out, vec![apply(5, true), apply(6, true), apply(7, true)]);
    out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(out, vec![Step::Duplicate { seq: 7 }]);
}

#[test]
fn failed_catch_up_applies_the_buffer_without_loss() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[7, 8]);
    let out = end(&mut s, ReplayEnd::Failed);
    assert_eq!(out, vec![apply(7, false), apply(8, false)]);
}

#[test]
fn first_batch_past_zero_without_replay_endpoint_is_applied() {
    let mut s = Sequencer::new(false, 8);
    assert_eq!(live(&mut s, &[7, 8]), vec![apply(7, false), apply(8, false)]);
}

#[test]
fn buffer_overflow_abandons_the_replay() {
    let mut s = Sequencer::new(true, 3);
    live(&mut s, &[0, 4, 5, 6]);
    let out = live(&mut s, &[7]);
    assert_eq!(
        out,
        vec![
            Step::AbandonReplay,
            Step::Lost { from: 1, to: 3, cause: LossCause::ReplayFailed },
            apply(4, false),
            apply(5, false),
            apply(6, false),
            apply(7, false),
        ]
    );
    assert_eq!(s.replaying(), None);
}

#[test]
fn gap_inside_the_buffer_starts_another_replay() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 2, 3, 6, 7]);
    replayed(&mut s, &[1, 2, 3]);
    let out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(
        out,
        vec![
            Step::Duplicate { seq: 2 },
            Step::Duplicate { seq: 3 },
            Step::Gap { from: 4, to: 5 },
            Step::Replay { from: 4, kind: ReplayKind::Gap },
        ]
    );
    assert_eq!(applied(&replayed(&mut s, &[4, 5, 6, 7])), vec![4, 5, 6, 7]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![Step::Duplicate { seq: 6 }, Step::Duplicate { seq: 7 }]);
}

#[test]
fn replies_without_a_replay_in_flight_are_ignored() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0]);
    assert!(replayed(&mut s, &[1]).is_empty());
    assert!(end(&mut s, ReplayEnd::Completed).is_empty());
    assert_eq!(s.last(), Some(0));
}

#[test]
fn restart_while_replaying_is_seen_in_the_buffer() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1, 4, 5, 0, 1]);
    replayed(&mut s, &[2, 3, 4, 5]);
    let out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(
        out,
        vec![Step::Duplicate { seq: 4 }, Step::Duplicate { seq: 5 }, Step::Clear, apply(0, false), apply(1, false),]
    );
}

#[test]
fn catch_up_cut_short_resumes_where_it_stopped_and_loses_nothing() {
    let mut s = Sequencer::new(true, 8);
    // First batch 6: catch up from 0; live 7 arrives meanwhile.
    assert_eq!(live(&mut s, &[6, 7]), vec![Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);
    // The answer stops after 0..=2 with no end marker.
    assert_eq!(applied(&replayed(&mut s, &[0, 1, 2])), vec![0, 1, 2]);
    let mut out = Vec::new();
    s.resume_replay(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 3, kind: ReplayKind::CatchUp }]);
    assert_eq!(s.replaying(), Some(ReplayKind::CatchUp), "the buffered live batches stay");
    // The second answer runs past the buffered batches, which are then duplicates.
    assert_eq!(applied(&replayed(&mut s, &[3, 4, 5, 6, 7])), vec![3, 4, 5, 6, 7]);
    let out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(out, vec![Step::Duplicate { seq: 6 }, Step::Duplicate { seq: 7 }]);
    assert_eq!(live(&mut s, &[8]), vec![apply(8, false)]);
}

#[test]
fn gap_replay_cut_short_resumes_and_reports_only_what_the_engine_lacks() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1]);
    assert_eq!(live(&mut s, &[6]), vec![Step::Gap { from: 2, to: 5 }, Step::Replay { from: 2, kind: ReplayKind::Gap }]);
    replayed(&mut s, &[2, 3]);
    let mut out = Vec::new();
    s.resume_replay(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 4, kind: ReplayKind::Gap }]);
    // The engine no longer holds 4; 5 heals the rest.
    let out = replayed(&mut s, &[5]);
    assert_eq!(out, vec![Step::Lost { from: 4, to: 4, cause: LossCause::NotInReplayBuffer }, apply(5, true)]);
    let out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(out, vec![apply(6, false)]);
}

#[test]
fn resume_without_a_replay_in_flight_asks_nothing() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1]);
    let mut out = Vec::new();
    s.resume_replay(&mut out);
    assert!(out.is_empty());
}

#[test]
fn catch_up_on_subscribing_asks_from_zero_before_any_batch() {
    let mut s = Sequencer::new(true, 8);
    let mut out = Vec::new();
    s.catch_up(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);
    // Live batches wait for the answer; the answer covers 0..=3.
    assert!(live(&mut s, &[3, 4]).is_empty());
    assert_eq!(applied(&replayed(&mut s, &[0, 1, 2, 3])), vec![0, 1, 2, 3]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![Step::Duplicate { seq: 3 }, apply(4, false)]);
}

#[test]
fn catch_up_on_subscribing_to_a_fresh_engine_waits_for_its_first_batch() {
    let mut s = Sequencer::new(true, 8);
    let mut out = Vec::new();
    s.catch_up(&mut out);
    assert!(end(&mut s, ReplayEnd::Completed).is_empty(), "nothing buffered, nothing lost");
    assert_eq!(live(&mut s, &[0, 1]), vec![apply(0, false), apply(1, false)]);
}

#[test]
fn catch_up_on_subscribing_needs_a_replay_endpoint_and_a_fresh_stream() {
    let mut s = Sequencer::<u64>::new(false, 8);
    let mut out = Vec::new();
    s.catch_up(&mut out);
    assert!(out.is_empty());
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0]);
    s.catch_up(&mut out);
    assert!(out.is_empty());
}

#[test]
fn hole_inside_an_answer_is_asked_again_not_skipped() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[9]);
    // 0 and 1 arrive, 2..=4 were dropped on the way, 5 follows.
    assert_eq!(applied(&replayed(&mut s, &[0, 1])), vec![0, 1]);
    assert_eq!(replayed(&mut s, &[5]), vec![Step::Replay { from: 2, kind: ReplayKind::CatchUp }]);
    // Replies of the old answer are gone with its socket; the new one starts at 2.
    assert_eq!(applied(&replayed(&mut s, &[2, 3, 4, 5, 6, 7, 8])), vec![2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![apply(9, false)]);
}

#[test]
fn gap_answer_with_a_hole_loses_nothing() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0]);
    live(&mut s, &[6]);
    replayed(&mut s, &[1, 2]);
    assert_eq!(replayed(&mut s, &[4]), vec![Step::Replay { from: 3, kind: ReplayKind::Gap }]);
    let out = replayed(&mut s, &[3, 4, 5]);
    assert_eq!(out, vec![apply(3, true), apply(4, true), apply(5, true)]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![apply(6, false)]);
}

#[test]
fn answer_whose_tail_was_dropped_is_asked_again_from_the_tail() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0]);
    live(&mut s, &[6]);
    replayed(&mut s, &[1, 2]);
    // The end marker got through, 3..=5 did not.
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![Step::Replay { from: 3, kind: ReplayKind::Gap }]);
    replayed(&mut s, &[3, 4, 5]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![apply(6, false)]);
}

#[test]
fn empty_answer_past_the_gap_is_still_a_loss_and_not_asked_again() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0]);
    live(&mut s, &[6]);
    // The engine answered nothing: it holds none of 1..=5 any more.
    let out = end(&mut s, ReplayEnd::Completed);
    assert_eq!(out, vec![Step::Lost { from: 1, to: 5, cause: LossCause::NotInReplayBuffer }, apply(6, false)]);
}

#[test]
fn reconnect_answer_from_zero_rebuilds_the_worker() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1, 2]);
    let mut out = Vec::new();
    s.reconnected(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::Reconnect }]);
    // A live batch of the new run, already past the old last.
    assert!(live(&mut s, &[6]).is_empty());
    let out = replayed(&mut s, &[0, 1]);
    assert_eq!(out, vec![Step::Rebuild, apply(0, true), apply(1, true)]);
    assert_eq!(applied(&replayed(&mut s, &[2, 3, 4, 5])), vec![2, 3, 4, 5]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![apply(6, false)]);
}

#[test]
fn reconnect_answer_past_zero_is_the_same_engine_asked_for_the_rest() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[10, 11, 12]);
    end(&mut s, ReplayEnd::Failed);
    let mut out = Vec::new();
    s.reconnected(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::Reconnect }]);
    // The engine's buffer starts at 9: it did not restart. Its answer from
    // there would be duplicates up to 12; only 13 on is asked for.
    assert_eq!(replayed(&mut s, &[9]), vec![Step::Replay { from: 13, kind: ReplayKind::Gap }]);
    assert_eq!(replayed(&mut s, &[13]), vec![apply(13, true)]);
    assert!(end(&mut s, ReplayEnd::Completed).is_empty());
    assert_eq!(live(&mut s, &[14]), vec![apply(14, false)]);
}

#[test]
fn reconnect_drops_what_a_replay_in_flight_had_buffered() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1, 2]);
    // The old run's 6 opens a gap replay, then the connection drops.
    assert_eq!(live(&mut s, &[6]), vec![Step::Gap { from: 3, to: 5 }, Step::Replay { from: 3, kind: ReplayKind::Gap }]);
    let mut out = Vec::new();
    s.reconnected(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::Reconnect }]);
    // The restarted engine's whole history is 0..=3: 6 never comes back.
    assert_eq!(
        replayed(&mut s, &[0, 1, 2, 3]),
        vec![Step::Rebuild, apply(0, true), apply(1, true), apply(2, true), apply(3, true)]
    );
    assert!(end(&mut s, ReplayEnd::Completed).is_empty());
    assert_eq!(live(&mut s, &[4]), vec![apply(4, false)]);
}

#[test]
fn reconnect_answered_by_nothing_starts_the_worker_afresh() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1, 2, 3, 4, 5]);
    let mut out = Vec::new();
    s.reconnected(&mut out);
    // The new run's first batches arrive; its replay socket never answers.
    assert!(live(&mut s, &[0, 1]).is_empty());
    assert_eq!(end(&mut s, ReplayEnd::Failed), vec![Step::Rebuild, apply(0, false), apply(1, false)]);
}

#[test]
fn reconnect_before_any_batch_is_a_plain_catch_up() {
    let mut s = Sequencer::<u64>::new(true, 8);
    let mut out = Vec::new();
    s.reconnected(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::CatchUp }]);
    let mut s = Sequencer::<u64>::new(false, 8);
    live(&mut s, &[0]);
    out.clear();
    s.reconnected(&mut out);
    assert!(out.is_empty(), "no replay endpoint, nothing to ask");
}

#[test]
fn an_unanswered_replay_asked_again_starts_where_it_did() {
    let mut s = Sequencer::new(true, 8);
    live(&mut s, &[0, 1, 2]);
    assert_eq!(live(&mut s, &[5]), vec![Step::Gap { from: 3, to: 4 }, Step::Replay { from: 3, kind: ReplayKind::Gap }]);
    let mut out = Vec::new();
    assert_eq!(s.silent_replays(), 0);
    s.resume_replay(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 3, kind: ReplayKind::Gap }], "the gap's start again");
    assert_eq!(s.silent_replays(), 1, "asked again without a batch applied");
    assert_eq!(applied(&replayed(&mut s, &[3])), vec![3]);
    assert_eq!(s.silent_replays(), 0, "a batch applied starts the count again");
    assert_eq!(applied(&replayed(&mut s, &[4])), vec![4]);
    assert_eq!(end(&mut s, ReplayEnd::Completed), vec![apply(5, false)]);
    assert_eq!(s.silent_replays(), 0, "no replay in flight");

    // A reconnect's replay, unanswered, is asked from 0 again: from `last`
    // on, the answer could not tell a restarted engine from the same one.
    let mut out = Vec::new();
    s.reconnected(&mut out);
    out.clear();
    s.resume_replay(&mut out);
    assert_eq!(out, vec![Step::Replay { from: 0, kind: ReplayKind::Reconnect }]);
    assert_eq!(s.silent_replays(), 1);
    // A reconnect replaces the replay in flight: its count starts at 0.
    s.reconnected(&mut out);
    assert_eq!(s.silent_replays(), 0);
}

/// Batches with stamps: `(seq, ts)`.
type Stamped = (u64, f64);

fn stamped(can_replay: bool) -> Sequencer<Stamped> {
    Sequencer::new(can_replay, 8).with_stamps(|&(_, ts)| Some(ts))
}

fn live_stamped(s: &mut Sequencer<Stamped>, batches: &[Stamped]) -> Vec<Step<Stamped>> {
    let mut out = Vec::new();
    for &batch in batches {
        s.live(batch.0, batch, &mut out);
    }
    out
}

fn replayed_stamped(s: &mut Sequencer<Stamped>, batches: &[Stamped]) -> Vec<Step<Stamped>> {
    let mut out = Vec::new();
    for &batch in batches {
        s.replayed(batch.0, batch, &mut out);
    }
    out
}

fn applied_stamped(steps: &[Step<Stamped>]) -> Vec<u64> {
    steps.iter().filter_map(|s| if let Step::Apply { seq, .. } = s { Some(*seq) } else { None }).collect()
}

#[test]
fn a_batch_overtaken_after_its_gap_was_healed_is_late_not_a_restart() {
    let mut s = stamped(true);
    live_stamped(&mut s, &[(0, 1.0), (1, 2.0)]);
    // 3 overtakes 2: a gap, healed by replay.
    let out = live_stamped(&mut s, &[(3, 4.0)]);
    assert_eq!(out[1], Step::Replay { from: 2, kind: ReplayKind::Gap });
    assert_eq!(applied_stamped(&replayed_stamped(&mut s, &[(2, 3.0), (3, 4.0)])), [2, 3]);
    let mut out = Vec::new();
    s.end_replay(ReplayEnd::Completed, &mut out);
    assert_eq!(out, [Step::Duplicate { seq: 3 }]);
    // Then 2 itself: late, dropped; the stream goes on.
    let out = live_stamped(&mut s, &[(2, 3.0), (4, 5.0)]);
    assert_eq!(out, [Step::Late { seq: 2 }, Step::Apply { seq: 4, payload: (4, 5.0), replayed: false }]);
}

#[test]
fn a_batch_overtaken_during_the_replay_is_late_when_the_replay_ends() {
    let mut s = stamped(true);
    live_stamped(&mut s, &[(0, 1.0), (1, 2.0), (3, 4.0), (2, 3.0)]);
    replayed_stamped(&mut s, &[(2, 3.0), (3, 4.0)]);
    let mut out = Vec::new();
    s.end_replay(ReplayEnd::Completed, &mut out);
    assert_eq!(out, [Step::Duplicate { seq: 3 }, Step::Late { seq: 2 }]);
    assert_eq!(s.last(), Some(3));
}

#[test]
fn without_replay_the_overtaken_batch_stays_lost_and_is_not_applied_out_of_order() {
    let mut s = stamped(false);
    let out = live_stamped(&mut s, &[(0, 1.0), (2, 3.0), (1, 2.0), (3, 4.0)]);
    assert_eq!(
        out,
        [
            Step::Apply { seq: 0, payload: (0, 1.0), replayed: false },
            Step::Gap { from: 1, to: 1 },
            Step::Lost { from: 1, to: 1, cause: LossCause::NoReplayEndpoint },
            Step::Apply { seq: 2, payload: (2, 3.0), replayed: false },
            Step::Late { seq: 1 },
            Step::Apply { seq: 3, payload: (3, 4.0), replayed: false },
        ]
    );
}

#[test]
fn a_restart_is_stamped_later_and_still_clears() {
    let mut s = stamped(false);
    live_stamped(&mut s, &[(0, 1.0), (1, 2.0), (2, 3.0)]);
    // Restarted after one batch: its 1 is newer than anything seen.
    let out = live_stamped(&mut s, &[(0, 10.0), (1, 11.0)]);
    assert_eq!(out[0], Step::Clear);
    assert_eq!(applied_stamped(&out), [0, 1]);
    // The same number twice with the same stamp is not a restart either.
    assert_eq!(live_stamped(&mut s, &[(1, 11.0)]), [Step::Late { seq: 1 }]);
}

#[test]
fn far_behind_is_a_restart_even_stamped_earlier() {
    // An engine restarted with its clock stepped back: taken for late only
    // within the window.
    let mut s = stamped(false);
    let first: Vec<Stamped> = (0..=LATE_WINDOW).map(|seq| (seq, 100.0 + seq as f64)).collect();
    live_stamped(&mut s, &first);
    assert_eq!(live_stamped(&mut s, &[(1, 50.0)]), [Step::Late { seq: 1 }]);
    let out = live_stamped(&mut s, &[(0, 50.0)]);
    assert_eq!(out[0], Step::Clear, "{LATE_WINDOW} behind");
}

#[test]
fn batch_ts_reads_both_envelopes_and_refuses_the_rest() {
    // [ts, events, dp_rank] and {"events": [], "ts": ts}, as vLLM and
    // SGLang send them (msgpack, ts a float64).
    let array = [0x93, 0xcb, 0x41, 0xd9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a, 0x90, 0xc0];
    assert_eq!(
        crate::wire::batch_ts(&array),
        Some(f64::from_be_bytes([0x41, 0xd9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a]))
    );
    let map =
        [0x82, 0xa6, b'e', b'v', b'e', b'n', b't', b's', 0x90, 0xa2, b't', b's', 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0];
    assert_eq!(crate::wire::batch_ts(&map), Some(1.0));
    assert_eq!(crate::wire::batch_ts(&[0x90]), None, "empty array");
    assert_eq!(crate::wire::batch_ts(&[0x81, 0xa1, b'x', 0x01]), None, "no ts");
    assert_eq!(crate::wire::batch_ts(&[0xc1]), None, "not msgpack");
    assert_eq!(crate::wire::batch_ts(&[]), None);
}
