//! Discovery against a fake API server that misbehaves the ways real ones
//! do: slow and failing first lists, dropped and cut watches, 410 Gone,
//! pagination, bookmarks.

use crate::support::{APP, FakeKube, Harness, Kind, NS, POOL, config, pod, pool};
use kvpick_discovery::{WorkerUpdate, worker_id};

/// Lists: the pool and pods `p0..p{n}` at 10.0.0.{1..}, ready.
fn seed(fake: &FakeKube, n: usize) {
    fake.put(Kind::InferencePool, pool(POOL, APP, &[8000]));
    for i in 0..n {
        fake.put(Kind::Pod, pod(&format!("p{i}"), APP, Some(&format!("10.0.0.{}", i + 1)), true));
    }
}

/// Waits until the pod and pool watches are both established.
async fn watches_open(h: &mut Harness) {
    h.wait_for("both watches open", |h| {
        h.fake.open_watches(Kind::Pod) == 1 && h.fake.open_watches(Kind::InferencePool) == 1
    })
    .await;
}

fn endpoints(ips: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = ips.iter().map(|i| format!("10.0.0.{i}:8000")).collect();
    v.sort();
    v
}

#[tokio::test]
async fn ready_only_after_the_first_full_paginated_list() {
    let fake = FakeKube::start(NS).await;
    seed(&fake, 5);
    fake.hold_lists(Kind::Pod);
    let mut cfg = config();
    cfg.list_page_size = 2;
    let mut h = Harness::with_fake(fake, cfg);

    // The pool is listed, the pods' list hangs: not ready, no workers.
    h.wait_for("the pool listed", |h| h.state().pool_present).await;
    h.wait_for("the pod list asked", |h| h.fake.lists(Kind::Pod) == 1).await;
    assert!(!h.state().listed && !h.state().is_ready());
    assert!(h.workers.is_empty());

    h.fake.release_lists(Kind::Pod);
    let want = endpoints(&[1, 2, 3, 4, 5]);
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    h.wait_endpoints(&want).await;
    h.wait_for("ready", |h| h.state().is_ready()).await;
    h.wait_for("the pod watch", |h| h.fake.open_watches(Kind::Pod) == 1).await;

    // Three pages: limit=2, then two `continue`s; the watch starts from the
    // list's resourceVersion.
    let reqs = h.fake.requests(Kind::Pod);
    let pages: Vec<_> = reqs.iter().filter(|r| !r.watch).collect();
    assert_eq!(pages.len(), 3, "{reqs:?}");
    assert!(pages.iter().all(|r| r.query.get("limit").map(String::as_str) == Some("2")));
    assert!(pages[1].query.contains_key("continue") && pages[2].query.contains_key("continue"));
    let watch = reqs.iter().find(|r| r.watch).expect("a pod watch");
    assert_eq!(watch.query.get("allowWatchBookmarks").map(String::as_str), Some("true"));
    assert!(watch.query.get("resourceVersion").is_some_and(|rv| rv != "0"));
    h.shutdown().await;
}

#[tokio::test]
async fn failing_first_lists_are_retried_with_back_off() {
    let fake = FakeKube::start(NS).await;
    seed(&fake, 2);
    fake.fail_next_lists(Kind::Pod, 503, 2);
    fake.fail_next_lists(Kind::InferencePool, 500, 1);
    fake.fail_next_lists(Kind::InferencePool, 403, 1);
    let mut h = Harness::with_fake(fake, config());
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000"]).await;
    h.wait_for("ready", |h| h.state().is_ready()).await;
    assert_eq!(h.fake.lists(Kind::Pod), 3);
    assert_eq!(h.fake.lists(Kind::InferencePool), 3);
    // Each refused list counted, as the one that answered.
    let [pool, pods, slices] = h.disc.metrics.watches();
    assert_eq!((pool.lists, pool.errors, pool.expired), (1, 2, 0));
    assert_eq!((pods.lists, pods.errors, pods.expired), (1, 2, 0));
    assert_eq!((slices.lists, slices.errors), (0, 0), "no peer service, no slice watch");
    h.shutdown().await;
}

#[tokio::test]
async fn dropped_or_cut_watches_resume_without_relisting() {
    let fake = FakeKube::start(NS).await;
    seed(&fake, 2);
    let mut h = Harness::with_fake(fake, config());
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000"]).await;

    for abrupt in [false, true] {
        watches_open(&mut h).await;
        let watches = h.fake.watches(Kind::Pod);
        h.fake.edit(|s| s.drop_watches(abrupt));
        h.wait_for("the pod watch back", |h| {
            h.fake.watches(Kind::Pod) > watches && h.fake.open_watches(Kind::Pod) == 1
        })
        .await;
        let [_, pods, _] = h.disc.metrics.watches();
        if abrupt {
            assert!(pods.errors >= 1, "a cut connection is a failed watch");
        } else {
            assert_eq!(pods.errors, 0, "a clean end (a server-side timeout) is not");
        }
    }
    // Changes made after the drops arrive over the resumed watch.
    h.fake.put(Kind::Pod, pod("p2", APP, Some("10.0.0.3"), true));
    h.fake.delete(Kind::Pod, "p0");
    h.wait_endpoints(&["10.0.0.2:8000", "10.0.0.3:8000"]).await;
    assert_eq!(h.fake.lists(Kind::Pod), 1, "resumed from the last resourceVersion, no relist");
    let [_, pods, _] = h.disc.metrics.watches();
    assert_eq!((pods.lists, pods.expired), (1, 0));
    assert_eq!(h.log.len(), 4, "{:?}", h.log);
    h.shutdown().await;
}

#[tokio::test]
async fn a_410_on_rewatch_relists_without_duplicate_or_lost_workers() {
    let fake = FakeKube::start(NS).await;
    seed(&fake, 4);
    let mut h = Harness::with_fake(fake, config());
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"]).await;
    watches_open(&mut h).await;
    let before = h.log.len();

    // In one step the watches are cut, the world changes unseen and the
    // history is compacted: the re-watch from the last version gets 410.
    h.fake.edit(|s| {
        s.drop_watches(true);
        s.delete(Kind::Pod, "p0"); // lost
        s.put(Kind::Pod, pod("p1", APP, Some("10.0.0.1"), false)); // unready
        s.put(Kind::Pod, pod("p3", APP, Some("10.0.0.33"), true)); // moved
        s.put(Kind::Pod, pod("p4", APP, Some("10.0.0.5"), true)); // new
        s.compact();
    });
    h.wait_endpoints(&["10.0.0.33:8000", "10.0.0.3:8000", "10.0.0.5:8000"]).await;
    assert_eq!(h.fake.lists(Kind::Pod), 2, "one relist after the 410");

    // p2, unchanged, was neither deleted nor upserted again; p3 moved.
    let since = &h.log[before..];
    let p2 = worker_id(NS, "p2", 8000);
    assert!(since.iter().all(|u| match u {
        WorkerUpdate::Upsert(w) => w.id() != p2,
        WorkerUpdate::Delete(id) => *id != p2,
    }));
    assert_eq!(since.len(), 5, "p0, p1 deleted; p3 deleted and upserted; p4 upserted: {since:?}");
    assert!(h.state().is_ready() && h.state().workers == 3);

    // The relisted watch goes on as usual.
    h.fake.put(Kind::Pod, pod("p1", APP, Some("10.0.0.1"), true));
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.33:8000", "10.0.0.3:8000", "10.0.0.5:8000"]).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_410_error_event_mid_watch_relists() {
    let fake = FakeKube::start(NS).await;
    seed(&fake, 2);
    let mut h = Harness::with_fake(fake, config());
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000"]).await;
    watches_open(&mut h).await;
    let before = h.log.len();

    h.fake.edit(|s| s.expire_watches());
    h.wait_for("a pod relist", |h| h.fake.lists(Kind::Pod) == 2 && h.fake.open_watches(Kind::Pod) == 1).await;
    h.wait_for("a pool relist", |h| h.fake.lists(Kind::InferencePool) == 2).await;
    h.wait_for("both relists counted", |h| h.disc.metrics.watches()[..2].iter().all(|w| w.lists == 2)).await;
    let [pool, pods, _] = h.disc.metrics.watches();
    assert_eq!(
        (pool.expired, pods.expired, pool.errors, pods.errors),
        (1, 1, 0, 0),
        "a 410 is an expiry, not an error"
    );
    // A change after the relist is the only update: the relist itself,
    // finding the same pods, changed nothing.
    h.fake.put(Kind::Pod, pod("p2", APP, Some("10.0.0.3"), true));
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]).await;
    assert!(matches!(&h.log[before..], [WorkerUpdate::Upsert(w)] if w.id() == worker_id(NS, "p2", 8000)));
    assert!(h.state().is_ready(), "a relist keeps readiness");
    h.shutdown().await;
}

#[tokio::test]
async fn bookmarks_keep_a_quiet_watch_resumable_past_compaction() {
    let fake = FakeKube::start(NS).await;
    seed(&fake, 1);
    let mut h = Harness::with_fake(fake, config());
    h.wait_endpoints(&["10.0.0.1:8000"]).await;
    watches_open(&mut h).await;

    // Unwatched writes move the resourceVersion on; a bookmark tells the
    // watches, so after compaction they resume from it instead of relisting.
    for i in 0..3 {
        h.fake.put(Kind::EndpointSlice, crate::support::slice(&format!("s{i}"), "unrelated", &[], &[]));
    }
    h.fake.edit(|s| s.bookmark());
    h.wait_for("two bookmarks sent", |h| h.fake.bookmarks_sent() == 2).await;
    h.fake.edit(|s| {
        s.compact();
        s.drop_watches(false);
    });
    h.fake.put(Kind::Pod, pod("p1", APP, Some("10.0.0.2"), true));
    h.wait_endpoints(&["10.0.0.1:8000", "10.0.0.2:8000"]).await;
    assert_eq!((h.fake.lists(Kind::Pod), h.fake.lists(Kind::InferencePool)), (1, 1), "no relist");
    h.shutdown().await;
}
