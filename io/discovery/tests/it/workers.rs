//! Discovery against a fake API server: which pods are workers, as pods and
//! the pool change.

use crate::support::{APP, Harness, Kind, NS, POOL, config, pod, pool, terminating};
use kvpick_core::Lifecycle;
use kvpick_discovery::{WorkerUpdate, worker_id};

#[tokio::test]
async fn pods_become_workers_and_stop_being_ones() {
    let mut h = Harness::start(config()).await;
    h.fake.put(Kind::InferencePool, pool(POOL, APP, &[8000]));
    h.fake.put(Kind::Pod, pod("vllm-0", APP, Some("10.0.0.1"), true));
    h.fake.put(Kind::Pod, pod("vllm-1", APP, Some("10.0.0.2"), false));
    h.fake.put(Kind::Pod, pod("vllm-2", APP, None, false));
    h.fake.put(Kind::Pod, pod("other", &[("app", "sglang")], Some("10.0.0.9"), true));
    h.wait_endpoints(&["10.0.0.1:8000"]).await;
    assert!(h.state().is_ready());
    let w = &h.workers[&worker_id(NS, "vllm-0", 8000)];
    assert_eq!((w.pod.as_str(), w.rank, w.spec.block_size), ("vllm-0", 0, 16));
    assert_eq!(w.publisher.endpoint, "tcp://10.0.0.1:5557");

    // Ready / unready / gets an IP and becomes ready.
    h.fake.put(Kind::Pod, pod("vllm-1", APP, Some("10.0.0.2"), true));
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000"]).await;
    // Unready keeps the worker, unschedulable: one upsert, no delete.
    let before = h.log.len();
    h.fake.put(Kind::Pod, pod("vllm-0", APP, Some("10.0.0.1"), false));
    h.wait_endpoints(&["10.0.0.2:8000"]).await;
    let id0 = worker_id(NS, "vllm-0", 8000);
    assert_eq!(h.workers[&id0].spec.lifecycle, Lifecycle::Unschedulable);
    assert!(matches!(&h.log[before..], [WorkerUpdate::Upsert(u)] if u.id() == id0), "{:?}", &h.log[before..]);
    assert_eq!(h.state().workers, 2);
    h.fake.put(Kind::Pod, pod("vllm-2", APP, Some("10.0.0.3"), true));
    h.wait_endpoints(&["10.0.0.2:8000", "10.0.0.3:8000"]).await;

    // Relabelled out of the pool, and another one in.
    h.fake.put(Kind::Pod, pod("vllm-2", &[("app", "vllm-canary")], Some("10.0.0.3"), true));
    h.fake.put(Kind::Pod, pod("other", APP, Some("10.0.0.9"), true));
    h.wait_endpoints(&["10.0.0.2:8000", "10.0.0.9:8000"]).await;

    // IP change: the same id, deleted then upserted at the new address.
    let id = worker_id(NS, "vllm-1", 8000);
    let before = h.log.len();
    h.fake.put(Kind::Pod, pod("vllm-1", APP, Some("10.0.1.2"), true));
    h.wait_endpoints(&["10.0.0.9:8000", "10.0.1.2:8000"]).await;
    assert!(
        matches!(&h.log[before..], [WorkerUpdate::Delete(d), WorkerUpdate::Upsert(u)] if *d == id && u.id() == id),
        "{:?}",
        &h.log[before..]
    );

    // Terminating, then deleted; deleting a pod that was never a worker.
    h.fake.put(Kind::Pod, terminating(pod("other", APP, Some("10.0.0.9"), true)));
    h.wait_endpoints(&["10.0.1.2:8000"]).await;
    h.fake.delete(Kind::Pod, "other");
    h.fake.delete(Kind::Pod, "vllm-0");
    h.fake.delete(Kind::Pod, "vllm-1");
    h.wait_endpoints(&[]).await;
    assert!(h.state().is_ready(), "no workers is still ready: the pool exists");

    // The pod watch never restarted.
    assert_eq!(h.fake.lists(Kind::Pod), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn every_target_port_is_a_worker_whose_kv_ports_follow_its_rank() {
    let mut cfg = config();
    cfg.kv_event_replay_port = Some(5600);
    cfg.model = Some("qwen".into());
    cfg.max_num_batched_tokens = Some(8192);
    cfg.total_kv_blocks = Some(4096);
    let mut h = Harness::start(cfg).await;
    h.fake.put(Kind::InferencePool, pool(POOL, APP, &[3000, 3002, 3004]));
    h.fake.put(Kind::Pod, pod("dp-0", APP, Some("10.0.0.1"), true));
    h.fake.put(Kind::Pod, pod("dp-1", APP, Some("10.0.0.2"), true));
    let both = ["10.0.0.1:3000", "10.0.0.1:3002", "10.0.0.1:3004", "10.0.0.2:3000", "10.0.0.2:3002", "10.0.0.2:3004"];
    h.wait_endpoints(&both).await;
    for (rank, port) in [3000u16, 3002, 3004].into_iter().enumerate() {
        let w = &h.workers[&worker_id(NS, "dp-1", port)];
        let rank = u16::try_from(rank).unwrap();
        assert_eq!(w.rank, rank);
        assert_eq!(w.publisher.worker, w.id());
        assert_eq!(w.publisher.endpoint, format!("tcp://10.0.0.2:{}", 5557 + rank));
        assert_eq!(w.publisher.replay_endpoint, Some(format!("tcp://10.0.0.2:{}", 5600 + rank)));
        assert_eq!(w.spec.model.as_deref(), Some("qwen"));
        assert_eq!((w.spec.max_num_batched_tokens, w.spec.total_kv_blocks), (Some(8192), Some(4096)));
    }

    // One pod going unready makes all three of its ranks unschedulable,
    // and Ready again schedulable: the same workers, never deleted.
    let before = h.log.len();
    h.fake.put(Kind::Pod, pod("dp-0", APP, Some("10.0.0.1"), false));
    h.wait_endpoints(&both[3..]).await;
    assert_eq!(h.state().workers, 6);
    h.fake.put(Kind::Pod, pod("dp-0", APP, Some("10.0.0.1"), true));
    h.wait_endpoints(&both).await;
    let updates = &h.log[before..];
    assert!(updates.len() == 6 && updates.iter().all(|u| matches!(u, WorkerUpdate::Upsert(_))), "{updates:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn the_pool_is_created_after_start_edited_and_deleted() {
    let mut h = Harness::start(config()).await;
    h.fake.put(Kind::Pod, pod("a", &[("app", "vllm"), ("gen", "1")], Some("10.0.0.1"), true));
    h.fake.put(Kind::Pod, pod("b", &[("app", "vllm"), ("gen", "2")], Some("10.0.0.2"), true));

    // No pool: listed, but not ready and no workers.
    h.wait_for("the first lists", |h| h.state().listed).await;
    assert!(!h.state().pool_present && !h.state().is_ready());
    assert!(h.workers.is_empty());

    h.fake.put(Kind::InferencePool, pool(POOL, APP, &[8000]));
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000"]).await;
    assert!(h.state().is_ready());

    // Another pool's changes are not ours.
    h.fake.put(Kind::InferencePool, pool("other-pool", &[("gen", "1")], &[9000]));

    // Selector edit: reconciled without restarting any watch.
    h.fake.put(Kind::InferencePool, pool(POOL, &[("gen", "2")], &[8000]));
    h.wait_endpoints(&["10.0.0.2:8000"]).await;
    // Ports edit: a port added, one removed.
    h.fake.put(Kind::InferencePool, pool(POOL, &[("gen", "2")], &[8001, 8002]));
    h.wait_endpoints(&["10.0.0.2:8001", "10.0.0.2:8002"]).await;
    assert_eq!(h.workers[&worker_id(NS, "b", 8002)].rank, 1);

    // An invalid spec empties the pool, a valid one brings it back.
    let mut broken = pool(POOL, APP, &[8000]);
    broken["spec"]["targetPorts"] = serde_json::json!([]);
    h.fake.put(Kind::InferencePool, broken);
    h.wait_for("an unusable pool", |h| !h.state().pool_present && h.workers.is_empty()).await;
    h.fake.put(Kind::InferencePool, pool(POOL, APP, &[8000]));
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000"]).await;

    // Deleted: no workers, not ready.
    h.fake.delete(Kind::InferencePool, POOL);
    h.wait_for("the pool gone", |h| !h.state().pool_present && h.workers.is_empty()).await;
    assert!(!h.state().is_ready() && h.state().listed);

    assert_eq!((h.fake.lists(Kind::Pod), h.fake.watches(Kind::Pod)), (1, 1), "the pod watch was restarted");
    assert_eq!(h.fake.lists(Kind::InferencePool), 1);
    let pool_list = &h.fake.requests(Kind::InferencePool)[0];
    assert_eq!(pool_list.query.get("fieldSelector").map(String::as_str), Some("metadata.name=vllm-pool"));
    h.shutdown().await;
}

#[tokio::test]
async fn discovery_stops_when_its_updates_are_no_longer_read() {
    let mut h = Harness::start(config()).await;
    h.fake.put(Kind::InferencePool, pool(POOL, APP, &[8000]));
    h.wait_for("ready", |h| h.state().is_ready()).await;
    assert!(!h.disc.is_finished());
    // Swap in a receiver whose sender stays open, and drop discovery's.
    let (_open, stand_in) = tokio::sync::mpsc::channel(1);
    drop(std::mem::replace(&mut h.disc.updates, stand_in));
    h.wait_for("the task to end", |h| h.disc.is_finished()).await;
    h.shutdown().await;
}
