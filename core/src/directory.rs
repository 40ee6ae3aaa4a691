//! Which shard owns which worker, and which models are served: the little
//! state a selection needs before it asks the shards anything.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use crate::request::SelectError;
use crate::worker::{Lifecycle, WorkerId, WorkerSpec};

#[derive(Debug)]
pub struct Directory {
    /// Each worker's shard, model and endpoint.
    owner: HashMap<WorkerId, (usize, Option<String>, SocketAddr)>,
    /// Workers that may take new requests now: readiness, and whether a
    /// role has anyone to pick, count these, not the kept unschedulable.
    schedulable: HashSet<WorkerId>,
    per_shard: Vec<usize>,
    /// Workers per served model; `None` counts workers serving any model.
    models: HashMap<Option<String>, u32>,
    /// Which worker an endpoint is, for a gateway's report of the one
    /// that served.
    at_endpoint: HashMap<SocketAddr, WorkerId>,
}

impl Directory {
    pub fn new(shards: usize) -> Self {
        Directory {
            owner: HashMap::new(),
            schedulable: HashSet::new(),
            per_shard: vec![0; shards.max(1)],
            models: HashMap::new(),
            at_endpoint: HashMap::new(),
        }
    }

    /// The worker serving at `endpoint`.
    pub fn worker_at(&self, endpoint: SocketAddr) -> Option<WorkerId> {
        self.at_endpoint.get(&endpoint).copied()
    }

    pub fn shard_of(&self, id: WorkerId) -> Option<usize> {
        self.owner.get(&id).map(|(shard, _, _)| *shard)
    }

    pub fn is_empty(&self) -> bool {
        self.owner.is_empty()
    }

    pub fn len(&self) -> usize {
        self.owner.len()
    }

    /// Workers whose lifecycle is `Schedulable`.
    pub fn schedulable_len(&self) -> usize {
        self.schedulable.len()
    }

    pub fn worker_ids(&self) -> Vec<WorkerId> {
        let mut ids: Vec<WorkerId> = self.owner.keys().copied().collect();
        ids.sort();
        ids
    }

    /// The shard owning `spec`'s worker: where it already lives, or the
    /// shard with the fewest workers (lowest index on ties). Stable while
    /// the worker lives.
    pub fn place(&mut self, spec: &WorkerSpec) -> usize {
        let shard = match self.owner.remove(&spec.id) {
            Some((shard, old_model, old_endpoint)) => {
                self.count_model(old_model, -1);
                self.forget_endpoint(spec.id, old_endpoint);
                shard
            }
            None => {
                let shard = (0..self.per_shard.len()).min_by_key(|&i| self.per_shard[i]).expect("at least one shard");
                self.per_shard[shard] += 1;
                shard
            }
        };
        self.count_model(spec.model.clone(), 1);
        self.owner.insert(spec.id, (shard, spec.model.clone(), spec.endpoint));
        if spec.lifecycle == Lifecycle::Schedulable {
            self.schedulable.insert(spec.id);
        } else {
            self.schedulable.remove(&spec.id);
        }
        self.at_endpoint.insert(spec.endpoint, spec.id);
        shard
    }

    /// `id` no longer serves at `endpoint` (unless another worker took it).
    fn forget_endpoint(&mut self, id: WorkerId, endpoint: SocketAddr) {
        if self.at_endpoint.get(&endpoint) == Some(&id) {
            self.at_endpoint.remove(&endpoint);
        }
    }

    pub fn remove(&mut self, id: WorkerId) -> Option<usize> {
        let (shard, model, endpoint) = self.owner.remove(&id)?;
        self.schedulable.remove(&id);
        self.forget_endpoint(id, endpoint);
        self.per_shard[shard] -= 1;
        self.count_model(model, -1);
        Some(shard)
    }

    fn count_model(&mut self, model: Option<String>, delta: i32) {
        let count = self.models.entry(model.clone()).or_default();
        *count = count.saturating_add_signed(delta);
        if *count == 0 {
            self.models.remove(&model);
        }
    }

    /// Errors that need no shard to be asked.
    pub fn check(&self, model: Option<&str>) -> Result<(), SelectError> {
        if self.owner.is_empty() {
            return Err(SelectError::NoWorkers);
        }
        if let Some(model) = model {
            if !self.models.contains_key(&None) && !self.models.contains_key(&Some(model.to_owned())) {
                return Err(SelectError::UnknownModel(model.to_owned()));
            }
        }
        Ok(())
    }
}
