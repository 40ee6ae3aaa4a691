//! Peer replicas from the EndpointSlices of kvpick's own Service.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use crate::support::{APP, FakeKube, Harness, Kind, NS, POOL, config, pod, pool, slice};

const SERVICE: &str = "kvpick-epp";
const OWN_IP: &str = "10.9.0.1";

fn addrs(list: &[&str]) -> BTreeSet<SocketAddr> {
    list.iter().map(|a| a.parse().expect("test address")).collect()
}

#[tokio::test]
async fn peers_follow_the_service_slices_without_ourselves() {
    let fake = FakeKube::start(NS).await;
    fake.put(Kind::InferencePool, pool(POOL, APP, &[8000]));
    fake.put(Kind::Pod, pod("vllm-0", APP, Some("10.0.0.1"), true));
    fake.put(Kind::EndpointSlice, slice("kvpick-epp-a", SERVICE, &[(OWN_IP, Some(true)), ("10.9.0.2", None)], &[]));
    fake.hold_lists(Kind::EndpointSlice);
    let mut cfg = config();
    cfg.peer_service = Some(SERVICE.into());
    cfg.pod_ip = Some(OWN_IP.parse().expect("ip"));
    let mut h = Harness::with_fake(fake, cfg);

    // Workers come, but readiness waits for the slices' first list too.
    h.wait_endpoints(&["10.0.0.1:8000"]).await;
    h.wait_for("the slice list asked", |h| h.fake.lists(Kind::EndpointSlice) == 1).await;
    assert!(h.state().pool_present && !h.state().listed && !h.state().is_ready());
    h.fake.release_lists(Kind::EndpointSlice);
    h.wait_for("the first peers", |h| h.peers() == addrs(&["10.9.0.2:9092"])).await;
    h.wait_for("ready", |h| h.state().is_ready()).await;
    let list = &h.fake.requests(Kind::EndpointSlice)[0];
    assert_eq!(list.query.get("labelSelector").map(String::as_str), Some("kubernetes.io/service-name=kvpick-epp"));

    // A second slice (the port named replica-agg wins), a not-ready
    // endpoint, and another Service's slice, which is not ours.
    h.fake.put(
        Kind::EndpointSlice,
        slice(
            "kvpick-epp-b",
            SERVICE,
            &[("10.9.0.3", Some(true)), ("10.9.0.4", Some(false))],
            &[("grpc", 9002), ("replica-agg", 9192)],
        ),
    );
    h.fake.put(Kind::EndpointSlice, slice("other-a", "other", &[("10.9.9.9", Some(true))], &[]));
    h.wait_for("two slices", |h| h.peers() == addrs(&["10.9.0.2:9092", "10.9.0.3:9192"])).await;

    // A peer becomes ready; another goes away; a slice is deleted.
    h.fake.put(
        Kind::EndpointSlice,
        slice("kvpick-epp-b", SERVICE, &[("10.9.0.3", Some(true)), ("10.9.0.4", Some(true))], &[("replica-agg", 9192)]),
    );
    h.wait_for("a ready peer", |h| h.peers() == addrs(&["10.9.0.2:9092", "10.9.0.3:9192", "10.9.0.4:9192"])).await;
    h.fake.put(Kind::EndpointSlice, slice("kvpick-epp-a", SERVICE, &[(OWN_IP, Some(true))], &[]));
    h.wait_for("a peer gone", |h| h.peers() == addrs(&["10.9.0.3:9192", "10.9.0.4:9192"])).await;
    h.fake.delete(Kind::EndpointSlice, "kvpick-epp-b");
    h.wait_for("no peers", |h| h.peers().is_empty()).await;

    // Peers never touch the workers.
    assert_eq!(h.endpoints(), ["10.0.0.1:8000"]);
    h.shutdown().await;
}

#[tokio::test]
async fn without_a_peer_service_no_slices_are_watched() {
    let fake = FakeKube::start(NS).await;
    fake.put(Kind::InferencePool, pool(POOL, APP, &[8000]));
    let mut h = Harness::with_fake(fake, config());
    h.wait_for("ready", |h| h.state().is_ready()).await;
    assert!(h.peers().is_empty());
    assert!(h.fake.requests(Kind::EndpointSlice).is_empty());
    h.shutdown().await;
}
