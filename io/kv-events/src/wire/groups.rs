//! Which KV cache groups to index, learned per publisher.

use super::DecodedEvent;
use kvpick_core::event::KvEvent;

/// Groups past this index are never learned (judged undecided unless the
/// event carries its kind). vLLM models have a handful.
const MAX_GROUPS: usize = 256;

/// Kinds of one publisher's KV cache groups, learned from the events that
/// carry `kv_cache_spec_kind` (vLLM sends it on `BlockStored`), to judge those
/// that carry only `group_idx` (vLLM's `BlockRemoved`). Keep one per
/// publisher (pod and data-parallel rank) and reset it when the engine
/// restarts (sequence number going back).
#[derive(Clone, Debug, Default)]
pub struct GroupKinds {
    /// `Some(full_attention)` per group index, once learned.
    full: Vec<Option<bool>>,
}

impl GroupKinds {
    pub fn new() -> Self {
        Self::default()
    }

    /// Learns from `event`, then says whether it belongs in the index:
    /// - `AllBlocksCleared`: yes;
    /// - with a kind: yes iff full attention (and the group learns it);
    /// - without a kind: the group's learned kind; else yes for group 0 or no
    ///   group, no for any other group (undecided: safer unindexed, as a
    ///   sliding-window group's blocks must never be matched as a prefix).
    pub fn should_index(&mut self, event: &DecodedEvent) -> bool {
        if matches!(event.event, KvEvent::Cleared) {
            return true;
        }
        if let Some(kind) = &event.kv_cache_spec_kind {
            let full = kind.is_full_attention();
            if let Some(group) = event.group_idx.map(|g| g as usize).filter(|&g| g < MAX_GROUPS) {
                if self.full.len() <= group {
                    self.full.resize(group + 1, None);
                }
                self.full[group] = Some(full);
            }
            return full;
        }
        match event.group_idx {
            None => true,
            Some(group) => self.learned(group).unwrap_or(group == 0),
        }
    }

    /// Whether `group` was learned to be full attention, if learned.
    pub fn learned(&self, group: u32) -> Option<bool> {
        self.full.get(group as usize).copied().flatten()
    }

    /// Every group's learned kind, by index (warm start: a peer's cut
    /// carries them, so removals naming only a group are judged as there).
    pub fn learned_all(&self) -> Vec<Option<bool>> {
        self.full.clone()
    }

    /// Kinds as a peer learned them (at most `MAX_GROUPS`).
    pub fn from_learned(mut full: Vec<Option<bool>>) -> Self {
        full.truncate(MAX_GROUPS);
        GroupKinds { full }
    }

    /// Forgets everything (engine restarted).
    pub fn clear(&mut self) {
        self.full.clear();
    }
}
