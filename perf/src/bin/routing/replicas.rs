//! kvpick as several replicas behind one gateway, which spreads requests
//! over them round-robin. Each replica is a whole kvpick (its own
//! `SelectionService`, configured as `kvpick serve` is by default)
//! subscribed to every engine's KV events. Shared, each replica publishes
//! its booking changes (core's `replica::Outbox`) and applies every peer's
//! (`replica::Inbox`) after a network delay; unshared, each books only the
//! requests that reach it, so all of them think the fleet idler than it is:
//! the herding sharing prevents.
//!
//! With a [`Join`], the last replica starts mid-run (a rollout, a
//! restart): before it, the gateway spreads requests over the others
//! only. Warm, it takes the first replica's KV index at that instant, as
//! `kvpick serve`'s warm start takes a peer's; cold, it knows only what
//! the engines store from then on. Either way its peers' links send it
//! their live bookings as it connects, as `kvpick serve`'s do.

use std::collections::{HashMap, VecDeque};

use kvpick_core::replica::{Batch, Inbox, InboxConfig, Incarnation, Outbox, ReplicaId};
use kvpick_core::{BookingEvent, ReservationId, RouterConfig, SelectionService, WorkerId};
use kvpick_perf::sim::{CacheEvent, EngineConfig};

use super::fleet::{Arrival, FleetView, Joined, Policy};
use super::kvpick_policy::{kv_event, millis, reserve, selection_service};

struct Replica {
    svc: SelectionService,
    outbox: Outbox,
    /// One per origin replica (its own is never fed).
    inboxes: Vec<Inbox>,
}

pub struct KvpickReplicas {
    replicas: Vec<Replica>,
    engines: usize,
    share: bool,
    delay_ns: u64,
    /// Batches on their way: (delivery time, to, batch), in delivery order
    /// (every batch takes the same delay).
    wire: VecDeque<(u64, usize, Batch)>,
    next: usize,
    /// Per routed request: the replica that picked it, its worker, the
    /// TTFT the priors predicted and when it was picked.
    picked: HashMap<usize, (usize, WorkerId, Option<f64>, u64)>,
    peer_changes: u64,
    peer_errors: u64,
    first_peer_error: Option<String>,
    join: Option<Join>,
    /// Replicas the gateway knows now (the last one only once it joined).
    active: usize,
    /// Requests the joining replica picked.
    by_joiner: Vec<usize>,
    /// Blocks the joining replica imported, and workers it could not.
    imported: (u64, usize),
}

/// The last replica joins at `at_ns`, with a peer's index or none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Join {
    pub at_ns: u64,
    pub warm: bool,
}

impl KvpickReplicas {
    pub fn new(
        replicas: usize,
        share: bool,
        delay_ns: u64,
        engines: usize,
        engine: &EngineConfig,
        cfg: RouterConfig,
        join: Option<Join>,
    ) -> Self {
        let count = replicas;
        let replicas = (0..replicas)
            .map(|r| Replica {
                svc: selection_service(
                    RouterConfig { seed: cfg.seed.wrapping_add(r as u64), ..cfg.clone() },
                    engine,
                    0..engines,
                ),
                outbox: Outbox::new(ReplicaId(r as u64 + 1), Incarnation(1)),
                inboxes: (0..replicas).map(|o| Inbox::new(ReplicaId(o as u64 + 1), InboxConfig::default())).collect(),
            })
            .collect();
        KvpickReplicas {
            replicas,
            engines,
            share,
            delay_ns,
            wire: VecDeque::new(),
            next: 0,
            picked: HashMap::new(),
            peer_changes: 0,
            peer_errors: 0,
            first_peer_error: None,
            join,
            active: if join.is_some() { count - 1 } else { count },
            by_joiner: Vec::new(),
            imported: (0, 0),
        }
    }

    /// Brings the last replica in once its time has come.
    fn join_if_due(&mut self, now_ns: u64) {
        let Some(join) = self.join.filter(|j| self.active < self.replicas.len() && now_ns >= j.at_ns) else { return };
        let j = self.replicas.len() - 1;
        let (veterans, joiner) = self.replicas.split_at_mut(j);
        let joiner = &mut joiner[0];
        if join.warm {
            for w in (0..self.engines as u64).map(WorkerId) {
                let Some(snapshot) = veterans[0].svc.export_worker(w) else { continue };
                match joiner.svc.import_worker(w, &snapshot) {
                    Ok(applied) => self.imported.0 += applied.stored,
                    Err(_) => self.imported.1 += 1,
                }
            }
        }
        if self.share {
            let engines = self.engines as u64;
            for (o, veteran) in veterans.iter().enumerate() {
                let snapshot = veteran.outbox.snapshot(millis(now_ns));
                for event in joiner.inboxes[o].resync(&snapshot, millis(now_ns), |w| w.0 < engines) {
                    self.peer_changes += 1;
                    let id = event.id();
                    if let Err(e) = joiner.svc.apply_peer_booking(snapshot.origin, event, millis(now_ns)) {
                        joiner.inboxes[o].not_applied(id);
                        self.peer_errors += 1;
                        self.first_peer_error.get_or_insert(format!("replica {j}: {e}"));
                    }
                }
            }
        }
        self.active = self.replicas.len();
    }

    /// Records replica `r`'s own change and, shared, sends it to every peer.
    fn publish(&mut self, r: usize, event: &BookingEvent, now_ns: u64) {
        if !self.share {
            return;
        }
        let replica = &mut self.replicas[r];
        replica.outbox.record(event, millis(now_ns));
        let Some(batch) = replica.outbox.take_batch() else { return };
        for to in (0..self.active).filter(|&to| to != r) {
            self.wire.push_back((now_ns + self.delay_ns, to, batch.clone()));
        }
    }

    /// Applies every batch due by `now_ns` at its replica.
    fn deliver(&mut self, now_ns: u64) {
        let engines = self.engines as u64;
        while self.wire.front().is_some_and(|(at, _, _)| *at <= now_ns) {
            let Some((at, to, batch)) = self.wire.pop_front() else { break };
            let replica = &mut self.replicas[to];
            let origin = (batch.origin.0 - 1) as usize;
            let received = replica.inboxes[origin].receive(&batch, millis(at), |w| w.0 < engines);
            let mut problems = Vec::new();
            if let Some(from) = received.resync_from {
                problems.push(format!("replica {to} lost replica {origin}'s events from {from} on a lossless link"));
            }
            for event in received.apply {
                self.peer_changes += 1;
                let id = event.id();
                if let Err(e) = replica.svc.apply_peer_booking(batch.origin, event, millis(at)) {
                    // The inbox must not think it held (it would never re-book it).
                    replica.inboxes[origin].not_applied(id);
                    problems.push(format!("replica {to}: {e}"));
                }
            }
            self.peer_errors += problems.len() as u64;
            if let Some(first) = problems.into_iter().next() {
                self.first_peer_error.get_or_insert(first);
            }
        }
    }
}

impl Policy for KvpickReplicas {
    fn route(&mut self, arrival: &Arrival<'_>, _: &FleetView<'_>) -> usize {
        self.join_if_due(arrival.now_ns);
        self.deliver(arrival.now_ns);
        let r = self.next % self.active;
        self.next = (r + 1) % self.active;
        if self.active == self.replicas.len() && self.join.is_some() && r == self.active - 1 {
            self.by_joiner.push(arrival.id);
        }
        let svc = &mut self.replicas[r].svc;
        let selection = reserve(svc, arrival);
        let booking = svc.booking(selection.id).expect("just reserved").clone();
        self.picked.insert(arrival.id, (r, selection.worker, selection.predicted_ttft_ns, arrival.now_ns));
        self.publish(r, &BookingEvent::Reserved(booking), arrival.now_ns);
        selection.worker.0 as usize
    }

    fn on_events(&mut self, engine: usize, events: &[CacheEvent], now_ns: u64) {
        self.join_if_due(now_ns);
        self.deliver(now_ns);
        for replica in &mut self.replicas[..self.active] {
            for event in events {
                // kvpick's own run (the `kvpick` policy) reports refusals;
                // the replicas see the same events.
                let _ = replica.svc.apply_kv_event(WorkerId(engine as u64), &kv_event(event));
            }
        }
    }

    fn on_first_token(&mut self, id: usize, now_ns: u64) {
        self.join_if_due(now_ns);
        self.deliver(now_ns);
        let Some(&(r, worker, predicted, at)) = self.picked.get(&id) else { return };
        let svc = &mut self.replicas[r].svc;
        if let Some(predicted) = predicted {
            let _ = svc.observe_ttft(worker, predicted, now_ns - at, millis(now_ns));
        }
        let id = ReservationId(id as u64);
        if svc.prefill_complete(id, millis(now_ns)).is_ok() {
            self.publish(r, &BookingEvent::PrefillComplete(id), now_ns);
        }
    }

    fn on_finished(&mut self, id: usize, now_ns: u64) {
        self.join_if_due(now_ns);
        self.deliver(now_ns);
        let Some((r, ..)) = self.picked.remove(&id) else { return };
        let id = ReservationId(id as u64);
        if self.replicas[r].svc.free_reservation(id, millis(now_ns)).is_ok() {
            self.publish(r, &BookingEvent::Freed(id), now_ns);
        }
    }

    fn notes(&self) -> Vec<String> {
        let mut note = format!(
            "kvpick ×{} ({}): {} peer booking changes applied",
            self.replicas.len(),
            if self.share { "shared" } else { "unshared" },
            self.peer_changes
        );
        if let Some(first) = &self.first_peer_error {
            note.push_str(&format!(", {} refused (first: {first})", self.peer_errors));
        }
        if let Some(join) = self.join {
            note.push_str(&format!(
                "; replica {} joined at {:.1} s {}, then picked {} requests",
                self.replicas.len(),
                join.at_ns as f64 / 1e9,
                if !join.warm {
                    "cold".to_owned()
                } else if self.imported.1 == 0 {
                    format!("warm ({} blocks imported)", self.imported.0)
                } else {
                    format!("warm ({} blocks imported, {} workers refused)", self.imported.0, self.imported.1)
                },
                self.by_joiner.len()
            ));
        }
        vec![note]
    }

    fn joined(&self) -> Option<Joined> {
        let join = self.join?;
        Some(Joined { at_ns: join.at_ns, requests: self.by_joiner.clone() })
    }
}
