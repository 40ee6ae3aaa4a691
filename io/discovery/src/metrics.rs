//! Discovery's counters, readable from any thread: how often each watched
//! resource was listed in full, how often its watch failed (the watcher
//! then backs off and resumes by itself) or expired (`410 Gone`, a
//! relist), and how often the workers file was refused. Every warning and
//! error discovery logs about the API server's answers or the workers
//! file moves one of them, so an operator can alert on a counter instead
//! of reading logs. (What it logs about the objects themselves, a pool
//! missing or unusable, a label ignored, a port past 65535, shows in
//! readiness and `inference_pool_ready_pods`, not in these.)

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A watched kind of object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    InferencePool,
    Pods,
    EndpointSlices,
}

impl Resource {
    pub const ALL: [Resource; 3] = [Resource::InferencePool, Resource::Pods, Resource::EndpointSlices];

    /// The `resource` label.
    pub fn label(self) -> &'static str {
        match self {
            Resource::InferencePool => "inferencepools",
            Resource::Pods => "pods",
            Resource::EndpointSlices => "endpointslices",
        }
    }
}

#[derive(Debug, Default)]
struct Watched {
    lists: AtomicU64,
    errors: AtomicU64,
    expired: AtomicU64,
}

/// One resource's counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchCounts {
    pub resource: Resource,
    /// Full lists completed (the first, and one per relist).
    pub lists: u64,
    /// Watch or list requests that failed (connection lost, error status,
    /// undecodable answer), each followed by a retry with back-off.
    pub errors: u64,
    /// Watches that expired (`410 Gone`), each followed by a relist.
    pub expired: u64,
}

#[derive(Debug, Default)]
pub struct DiscoveryMetrics {
    watched: [Watched; 3],
    workers_file_errors: AtomicU64,
}

impl DiscoveryMetrics {
    fn of(&self, resource: Resource) -> &Watched {
        &self.watched[resource as usize]
    }

    pub(crate) fn listed(&self, resource: Resource) {
        self.of(resource).lists.fetch_add(1, Relaxed);
    }

    pub(crate) fn failed(&self, resource: Resource) {
        self.of(resource).errors.fetch_add(1, Relaxed);
    }

    pub(crate) fn expired(&self, resource: Resource) {
        self.of(resource).expired.fetch_add(1, Relaxed);
    }

    pub(crate) fn workers_file_refused(&self) {
        self.workers_file_errors.fetch_add(1, Relaxed);
    }

    pub fn watches(&self) -> [WatchCounts; 3] {
        Resource::ALL.map(|resource| {
            let w = self.of(resource);
            WatchCounts {
                resource,
                lists: w.lists.load(Relaxed),
                errors: w.errors.load(Relaxed),
                expired: w.expired.load(Relaxed),
            }
        })
    }

    /// Reads of the workers file that were refused (unreadable, too big,
    /// invalid); the previous workers stay.
    pub fn workers_file_errors(&self) -> u64 {
        self.workers_file_errors.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_resource_counts_apart() {
        let m = DiscoveryMetrics::default();
        m.listed(Resource::Pods);
        m.listed(Resource::Pods);
        m.failed(Resource::InferencePool);
        m.expired(Resource::EndpointSlices);
        m.workers_file_refused();
        let [pool, pods, slices] = m.watches();
        assert_eq!((pool.resource, pool.lists, pool.errors, pool.expired), (Resource::InferencePool, 0, 1, 0));
        assert_eq!((pods.resource.label(), pods.lists, pods.errors), ("pods", 2, 0));
        assert_eq!((slices.expired, slices.lists), (1, 0));
        assert_eq!(m.workers_file_errors(), 1);
    }
}
