//! Requests waiting for capacity: bounded, highest priority first, first
//! come first served within a priority.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use crate::booking::ReservationId;
use crate::clock::Millis;
use crate::request::SelectRequest;

type Position = (Reverse<i32>, u64);

#[derive(Debug)]
pub struct Waiting {
    pub request: SelectRequest,
    pub deadline: Millis,
}

#[derive(Debug)]
pub struct AdmissionQueue {
    order: BTreeMap<Position, Waiting>,
    positions: HashMap<ReservationId, Position>,
    arrivals: u64,
    capacity: usize,
}

impl AdmissionQueue {
    pub fn new(capacity: usize) -> Self {
        AdmissionQueue { order: BTreeMap::new(), positions: HashMap::new(), arrivals: 0, capacity }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn contains(&self, id: ReservationId) -> bool {
        self.positions.contains_key(&id)
    }

    /// Gives the request back when the queue is full (boxed: a refusal is
    /// the rare path, and the request is larger than a result should be).
    pub fn push(&mut self, request: SelectRequest, deadline: Millis) -> Result<(), Box<SelectRequest>> {
        if self.order.len() >= self.capacity {
            return Err(Box::new(request));
        }
        let position = (Reverse(request.priority), self.arrivals);
        self.arrivals += 1;
        self.positions.insert(request.id, position);
        self.order.insert(position, Waiting { request, deadline });
        Ok(())
    }

    pub fn remove(&mut self, id: ReservationId) -> Option<Waiting> {
        let position = self.positions.remove(&id)?;
        self.order.remove(&position)
    }

    /// Ids in admission order.
    pub fn ids(&self) -> Vec<ReservationId> {
        self.order.values().map(|w| w.request.id).collect()
    }

    pub fn get(&self, id: ReservationId) -> Option<&Waiting> {
        self.positions.get(&id).and_then(|p| self.order.get(p))
    }

    /// Removes and returns every request whose deadline passed, in order.
    pub fn expire(&mut self, now: Millis) -> Vec<Waiting> {
        let late: Vec<ReservationId> =
            self.order.values().filter(|w| w.deadline <= now).map(|w| w.request.id).collect();
        late.into_iter().filter_map(|id| self.remove(id)).collect()
    }
}
