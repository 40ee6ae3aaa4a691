//! grpc.health.v1 on its own port and on the ext_proc port: liveness at
//! once, readiness (and the names gateways probe) only with a schedulable
//! worker; Watch streams the change.

use crate::ext_proc_support::*;
use kvpick_grpc::health::{EXT_PROC, INFERENCE_EXTENSION, LIVENESS, READINESS};
use kvpick_proto::health::HealthCheckRequest;
use kvpick_proto::health::health_check_response::ServingStatus;
use kvpick_proto::health::health_client::HealthClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;

async fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connects")
}

async fn check(client: &mut HealthClient<Channel>, service: &str) -> ServingStatus {
    let request = HealthCheckRequest { service: service.into() };
    let status = client.check(request).await.expect("check answers").into_inner().status;
    ServingStatus::try_from(status).expect("a known status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_schedulable_workers() {
    let h = Harness::start(Options { workers: 0, ..Options::default() }).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let health_port = h.health.spawn_on(listener).expect("health serves");
    let mut own = HealthClient::new(channel(health_port.local_addr()).await);
    let mut on_ext_proc = HealthClient::new(channel(h.addr).await);

    let mut watch =
        own.watch(HealthCheckRequest { service: READINESS.into() }).await.expect("watch opens").into_inner();
    let first = watch.message().await.expect("watch answers").expect("a status").status;
    assert_eq!(ServingStatus::try_from(first), Ok(ServingStatus::NotServing));

    for client in [&mut own, &mut on_ext_proc] {
        assert_eq!(check(client, LIVENESS).await, ServingStatus::Serving);
        assert_eq!(check(client, "").await, ServingStatus::Serving);
        for gated in [READINESS, INFERENCE_EXTENSION, EXT_PROC] {
            assert_eq!(check(client, gated).await, ServingStatus::NotServing, "{gated}");
        }
    }

    // A worker appears (the wiring reports it).
    h.add_worker(0).await;
    h.health.readiness().set_schedulable_workers(1);
    let next = tokio::time::timeout(WAIT, watch.message()).await.expect("in time").expect("ok").expect("a status");
    assert_eq!(ServingStatus::try_from(next.status), Ok(ServingStatus::Serving));
    for client in [&mut own, &mut on_ext_proc] {
        for gated in [READINESS, INFERENCE_EXTENSION, EXT_PROC] {
            assert_eq!(check(client, gated).await, ServingStatus::Serving, "{gated}");
        }
    }

    // Its KV events carry another block size: nothing it caches can match,
    // so kvpick is not ready with it alone; one usable worker more, it is.
    h.health.readiness().set_unusable_workers(1);
    let next = tokio::time::timeout(WAIT, watch.message()).await.expect("in time").expect("ok").expect("a status");
    assert_eq!(ServingStatus::try_from(next.status), Ok(ServingStatus::NotServing));
    h.health.readiness().set_schedulable_workers(2);
    let next = tokio::time::timeout(WAIT, watch.message()).await.expect("in time").expect("ok").expect("a status");
    assert_eq!(ServingStatus::try_from(next.status), Ok(ServingStatus::Serving));
    h.health.readiness().set_unusable_workers(0);
    h.health.readiness().set_schedulable_workers(1);

    // And goes away.
    h.health.readiness().set_schedulable_workers(0);
    let next = tokio::time::timeout(WAIT, watch.message()).await.expect("in time").expect("ok").expect("a status");
    assert_eq!(ServingStatus::try_from(next.status), Ok(ServingStatus::NotServing));
    assert_eq!(check(&mut own, LIVENESS).await, ServingStatus::Serving);

    let unknown = own.check(HealthCheckRequest { service: "nope".into() }).await.expect_err("unknown name");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    drop((watch, own, on_ext_proc));
    health_port.shutdown().await.expect("health stops");
    h.stop().await;
}
