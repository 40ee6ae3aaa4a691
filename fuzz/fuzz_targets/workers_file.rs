//! The workers file parser (`kvpick_discovery::workers_file::parse`), fed
//! any text as YAML or JSON (anchors, aliases, odd scalars, huge lists).
//!
//! Invariants: no panic; an accepted file lists at most `MAX_WORKERS`
//! workers, each under the id of its endpoint, with kvpick's block size and
//! its publisher under the same id; parsing the same text again gives the
//! same workers; from nothing, every worker is one upsert, and the same
//! workers again need no update.

#![no_main]

use std::collections::BTreeMap;

use kvpick_discovery::workers_file::{self, Defaults, MAX_WORKERS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let defaults = Defaults { block_size: 16, model: None, max_num_batched_tokens: None, total_kv_blocks: None };
    let Ok(workers) = workers_file::parse(text, &defaults) else { return };
    assert!(workers.len() <= MAX_WORKERS);
    for (id, worker) in &workers {
        assert_eq!(*id, workers_file::static_worker_id(worker.spec.endpoint));
        assert_eq!(worker.spec.id, *id);
        assert_eq!(worker.publisher.worker, *id);
        assert_eq!(worker.spec.block_size, defaults.block_size);
    }
    assert_eq!(workers_file::parse(text, &defaults).as_ref(), Ok(&workers));
    assert_eq!(workers_file::diff(&BTreeMap::new(), &workers).len(), workers.len());
    assert!(workers_file::diff(&workers, &workers).is_empty());
});
