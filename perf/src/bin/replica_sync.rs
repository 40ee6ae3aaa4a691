//! `kvpick-bench-replica-sync`: what sharing bookings costs a replica's
//! CPU, against what a pick costs it, in the same run.
//!
//! Two `SelectionService`s of 64 workers hold the same cached prompts
//! (shared system prompts cached on a few workers each). A step is one
//! request's worth of booking changes: a new request reserved, the one
//! 128 steps earlier done with prefill, the one 256 steps earlier freed
//! (so about 256 bookings are live, as under load). It times, per step:
//! - **own**: the origin's own work: `select_and_reserve`,
//!   `prefill_complete`, `free_reservation` (the baseline);
//! - **send**: recording the three changes in the `Outbox` and encoding
//!   them as `kvpick.peer.v1` frames, one frame per change (a transport
//!   that sends each change at once) or one frame per 16 steps (batched);
//! - **receive**: decoding those frames, the peer's `Inbox`, and applying
//!   the changes with `apply_peer_booking` on the other service.
//!
//! Progress goes to stderr; the report (Markdown) to stdout.

use std::time::Duration;

use kvpick_core::replica::{Inbox, InboxConfig, Incarnation, Outbox, ReplicaId};
use kvpick_core::{
    Admission, BookingEvent, HashSeed, Millis, ReservationId, SelectRequest, SelectionService, WorkerId,
};
use kvpick_perf::args::{ArgsError, usage};
use kvpick_perf::measure::{Budget, LatencySummary, time_each};
use kvpick_perf::report::{Table, bytes, cpu, load_average, ns, ratio, thousands, utc_date};
use kvpick_perf::setup;
use kvpick_perf::workload::BLOCK_SIZE;
use kvpick_replica::{Frame, Limits, decode, encode};

const BIN: &str = "kvpick-bench-replica-sync";
const WORKERS: u32 = 64;
const PROMPT_TOKENS: usize = 2048;
const SYSTEM_PROMPTS: u64 = 16;
const PREFILL_LAG: u64 = 128;
const FREE_LAG: u64 = 256;
const BATCH_STEPS: u64 = 16;
const NOW: Millis = Millis(1_000);

fn prompt_tokens(request: u64) -> Vec<u32> {
    // The first half is one of the system prompts, the rest the request's own.
    let system = (request % SYSTEM_PROMPTS) as u32;
    let half = PROMPT_TOKENS as u32 / 2;
    (0..half)
        .map(|t| system * 1_000_000 + t)
        .chain((0..half).map(|t| 500_000_000 + request as u32 * 4096 + t))
        .collect()
}

fn service() -> SelectionService {
    let mut svc = setup::service(WORKERS, 1);
    for system in 0..SYSTEM_PROMPTS {
        let tokens = prompt_tokens(system);
        for copy in 0..4 {
            let worker = (system * 4 + copy) % u64::from(WORKERS);
            let event = setup::cached_prompt(worker, system, &tokens[..PROMPT_TOKENS / 2], BLOCK_SIZE);
            svc.apply_kv_event(WorkerId(worker), &event).expect("a fresh worker takes a root chain");
        }
    }
    svc
}

/// The origin's own work for step `i`; returns its booking changes.
fn own_step(svc: &mut SelectionService, i: u64) -> [Option<BookingEvent>; 3] {
    let request = SelectRequest {
        id: ReservationId(i),
        prompt: svc.prompt(&prompt_tokens(i), HashSeed::default()),
        model: None,
        allowed: None,
        priority: 0,
        sticky: None,
    };
    let reserved = match svc.select_and_reserve(request, NOW) {
        Ok(Admission::Reserved(selection)) => svc.booking(selection.id).cloned().map(BookingEvent::Reserved),
        other => panic!("64 idle workers and no queue always reserve: {other:?}"),
    };
    let completed = i.checked_sub(PREFILL_LAG).map(ReservationId).filter(|id| svc.prefill_complete(*id, NOW).is_ok());
    let freed = i.checked_sub(FREE_LAG).map(ReservationId).filter(|id| svc.free_reservation(*id, NOW).is_ok());
    [reserved, completed.map(BookingEvent::PrefillComplete), freed.map(BookingEvent::Freed)]
}

struct Run {
    own: LatencySummary,
    send: LatencySummary,
    receive: LatencySummary,
    frame_bytes: u64,
    steps: u64,
}

/// `batch_steps` steps' changes go in one frame.
fn run(steps: u64, batch_steps: u64) -> Run {
    let budget = Budget { warmup: 0, min_iters: steps, max_iters: steps, time: Duration::MAX };
    // The origin's own steps, timed; their changes kept for the other two.
    let mut origin = service();
    let mut changes: Vec<[Option<BookingEvent>; 3]> = Vec::with_capacity(steps as usize);
    let own = time_each(&budget, |i| changes.push(own_step(&mut origin, i)));

    let mut outbox = Outbox::new(ReplicaId(1), Incarnation(1));
    let mut frames: Vec<Vec<Vec<u8>>> = Vec::with_capacity(steps as usize);
    let send = time_each(&budget, |i| {
        let mut out = Vec::new();
        for change in changes[i as usize].iter().flatten() {
            outbox.record(change, NOW);
            if batch_steps == 1 {
                out.extend(outbox.take_batch().map(|batch| encode(&Frame::Batch(batch))));
            }
        }
        if batch_steps > 1 && (i + 1) % batch_steps == 0 {
            out.extend(outbox.take_batch().map(|batch| encode(&Frame::Batch(batch))));
        }
        frames.push(out);
    });
    let frame_bytes = frames.iter().flatten().map(|f| f.len() as u64).sum();

    let mut peer = service();
    let mut inbox = Inbox::new(ReplicaId(1), InboxConfig::default());
    let limits = Limits::default();
    let mut problems = 0u64;
    let receive = time_each(&budget, |i| {
        for bytes in &frames[i as usize] {
            let Ok(Frame::Batch(batch)) = decode(bytes, &limits) else {
                problems += 1;
                continue;
            };
            let received = inbox.receive(&batch, NOW, |w| w.0 < u64::from(WORKERS));
            problems += u64::from(received.resync_from.is_some());
            for event in received.apply {
                problems += u64::from(peer.apply_peer_booking(ReplicaId(1), event, NOW).is_err());
            }
        }
    });
    assert_eq!(problems, 0, "every frame decodes and applies");
    // The peer books what the origin books (the last batch may be unsent).
    let (theirs, ours) = (origin.active_reservations(), peer.active_reservations());
    assert!(theirs.abs_diff(ours) <= 3 * batch_steps as usize, "origin {theirs} vs peer {ours} live");
    Run { own, send, receive, frame_bytes, steps }
}

fn main() -> std::process::ExitCode {
    let args = match kvpick_perf::args::Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(ArgsError::Help) => {
            print!("{}", usage(BIN));
            return std::process::ExitCode::SUCCESS;
        }
        Err(ArgsError::Invalid(message)) => {
            eprintln!("{message}\n\n{}", usage(BIN));
            return std::process::ExitCode::from(2);
        }
    };
    let steps = if args.quick { 2_000 } else { 20_000 };
    println!("- date {} · {} · load average at start {}", utc_date(), cpu(), load_average());
    if cfg!(debug_assertions) {
        println!("- **debug build**: run with --release");
    }
    println!(
        "- {WORKERS} workers, {PROMPT_TOKENS}-token prompts ({} blocks, the first half one of {SYSTEM_PROMPTS} cached system prompts), about {FREE_LAG} bookings live; {} steps per run\n",
        PROMPT_TOKENS / BLOCK_SIZE as usize,
        thousands(steps)
    );
    let mut table = Table::new(
        "Booking sharing per request (one step: a reserve, a prefill end, a free)",
        &[
            "frames",
            "own mean ns",
            "own p99 ns",
            "send mean ns",
            "send p99 ns",
            "receive mean ns",
            "receive p99 ns",
            "send ÷ own",
            "receive ÷ own",
            "bytes per request",
        ],
    );
    for (label, batch_steps) in [("one per change", 1), ("one per 16 requests", BATCH_STEPS)] {
        kvpick_perf::progress!(BIN, "{label}");
        let r = run(steps, batch_steps);
        table.row([
            label.to_string(),
            ns(r.own.mean as u64),
            ns(r.own.p99),
            ns(r.send.mean as u64),
            ns(r.send.p99),
            ns(r.receive.mean as u64),
            ns(r.receive.p99),
            ratio(r.send.mean, r.own.mean),
            ratio(r.receive.mean, r.own.mean),
            bytes(r.frame_bytes as f64 / r.steps as f64),
        ]);
    }
    table.note("own: the origin's select_and_reserve + prefill_complete + free_reservation; send: Outbox + encoding; receive: decoding + Inbox + apply_peer_booking on the peer's service. Per step, one thread, no transport.");
    table.note(
        "Ratios of means: batched, the send and receive costs fall on every 16th step (their p99 is a whole batch).",
    );
    print!("{table}");
    std::process::ExitCode::SUCCESS
}
