//! One watched resource's objects, by name, with relists applied atomically.
//!
//! kube-runtime's watcher reports a (re)list as `Init`, `InitApply`…,
//! `InitDone`. The objects of a relist are buffered and swapped in at
//! `InitDone`, so the previous view stays in force while a relist (after
//! `410 Gone`, or a restarted watch) is in flight, and anything missing from
//! the relist counts as deleted: nothing is lost, nothing doubled.

use std::collections::BTreeMap;

/// A watcher event, reduced to names and the facts kept of each object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change<T> {
    Init,
    InitApply(String, T),
    InitDone,
    Apply(String, T),
    Delete(String),
}

#[derive(Debug)]
pub(crate) struct Store<T> {
    items: BTreeMap<String, T>,
    relist: Option<BTreeMap<String, T>>,
    listed: bool,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Store { items: BTreeMap::new(), relist: None, listed: false }
    }
}

/// What a change did to the store's visible contents.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Nothing visible changed (a relist in progress).
    None,
    /// These names may have changed.
    Names(Vec<String>),
    /// A relist completed: anything may have changed.
    Replaced,
}

impl<T: Clone> Store<T> {
    pub fn apply(&mut self, change: Change<T>) -> Effect {
        match change {
            Change::Init => {
                self.relist = Some(BTreeMap::new());
                Effect::None
            }
            Change::InitApply(name, item) => match &mut self.relist {
                Some(buf) => {
                    buf.insert(name, item);
                    Effect::None
                }
                // kube-runtime always sends Init first; be lenient anyway.
                None => self.upsert(name, item),
            },
            Change::InitDone => {
                if let Some(buf) = self.relist.take() {
                    self.items = buf;
                }
                self.listed = true;
                Effect::Replaced
            }
            Change::Apply(name, item) => self.upsert(name, item),
            Change::Delete(name) => {
                if let Some(buf) = &mut self.relist {
                    buf.remove(&name);
                }
                self.items.remove(&name);
                Effect::Names(vec![name])
            }
        }
    }

    /// An object seen outside a list. (kube-runtime sends none during a
    /// relist; were one sent, the relist buffer gets it too so `InitDone`
    /// cannot roll it back.)
    fn upsert(&mut self, name: String, item: T) -> Effect {
        if let Some(buf) = &mut self.relist {
            buf.insert(name.clone(), item.clone());
        }
        self.items.insert(name.clone(), item);
        Effect::Names(vec![name])
    }

    /// The first full list has completed.
    pub fn listed(&self) -> bool {
        self.listed
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        self.items.get(name)
    }

    pub fn items(&self) -> &BTreeMap<String, T> {
        &self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relist_replaces_the_view_only_when_done() {
        let mut s = Store::default();
        assert_eq!(s.apply(Change::Init), Effect::None);
        s.apply(Change::InitApply("a".into(), 1));
        s.apply(Change::InitApply("b".into(), 2));
        assert!(s.items().is_empty() && !s.listed());
        assert_eq!(s.apply(Change::InitDone), Effect::Replaced);
        assert!(s.listed());
        assert_eq!(s.apply(Change::Apply("c".into(), 3)), Effect::Names(vec!["c".into()]));
        assert_eq!(s.items().len(), 3);

        // Relist without "a": it stays visible until InitDone, then is gone.
        s.apply(Change::Init);
        s.apply(Change::InitApply("b".into(), 20));
        s.apply(Change::InitApply("c".into(), 3));
        assert_eq!(s.get("a"), Some(&1));
        assert_eq!(s.get("b"), Some(&2));
        s.apply(Change::InitDone);
        assert_eq!(s.get("a"), None);
        assert_eq!(s.get("b"), Some(&20));
        assert_eq!(s.apply(Change::Delete("b".into())), Effect::Names(vec!["b".into()]));
        assert_eq!(s.items().keys().collect::<Vec<_>>(), ["c"]);
    }
}
