//! Replicas speaking mutual TLS to each other (`KVPICK_PEER_TLS_DIR`):
//! certificates issued here by a test CA, as cert-manager would issue
//! them into a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`,
//! `ca.crt`). Bookings flow between replicas whose certificates the pool's
//! CA signed; a replica holding another CA's certificate, and a caller
//! with no certificate at all, get nothing through.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;

use kvpick_app::app::settings as var;
use kvpick_app::app::{App, ServeConfig};
use kvpick_replica::codec::RawCodec;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::bin_support::{TempDir, fleet, write_workers};
use crate::ext_proc_support::{finish_response, wait_for};
use crate::replicas::{body, free_port, links_up, open, pick, prefill_on, replica_with, text};

/// The name a headless Service's certificate carries.
const SERVICE_NAME: &str = "kvpick-peers.test.svc";

/// A certificate authority made for the test.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let pem = params.self_signed(&key).unwrap_or_else(|e| panic!("{e}")).pem();
        Ca { pem, issuer: Issuer::new(params, key) }
    }

    /// A certificate for `names` (IP addresses or DNS names), good for
    /// both ends of a peer stream; and its key.
    fn issue(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap_or_else(|e| panic!("{e}"));
        params.distinguished_name.push(DnType::CommonName, "kvpick replica");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let cert = params.signed_by(&key, &self.issuer).unwrap_or_else(|e| panic!("{e}"));
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes a Secret's three files into `dir`, as its volume would mount them.
fn secret_dir(dir: &Path, (cert, key): &(String, String), ca_pem: &str) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for (name, text) in [("tls.crt", cert.as_str()), ("tls.key", key.as_str()), ("ca.crt", ca_pem)] {
        std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn tls_settings(dir: &Path, server_name: Option<&str>) -> Vec<(&'static str, String)> {
    let mut settings = vec![(var::PEER_TLS_DIR, dir.display().to_string())];
    if let Some(name) = server_name {
        settings.push((var::PEER_TLS_SERVER_NAME, name.to_owned()));
    }
    settings
}

/// A raw peer stream to `to` over TLS that sends nothing and ends; how
/// it went.
async fn empty_exchange(to: SocketAddr, tls: ClientTlsConfig) -> Result<(), String> {
    let channel = Endpoint::from_shared(format!("https://{to}"))
        .and_then(|e| e.tls_config(tls))
        .map_err(|e| format!("endpoint: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.map_err(|e| format!("ready: {e}"))?;
    let (tx, rx) = mpsc::channel(1);
    drop(tx);
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/kvpick.peer.v1.Peer/Exchange");
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let token = tonic::metadata::MetadataValue::from_static("Bearer replica-test-token");
    request.metadata_mut().insert("authorization", token);
    let mut answers = client.streaming(request, path, RawCodec).await.map_err(|s| format!("call: {s}"))?.into_inner();
    while answers.message().await.map_err(|s| format!("answer: {s}"))?.is_some() {}
    Ok(())
}

fn reconnects(app: &App) -> u64 {
    app.replicas().map_or(0, |r| r.transport.reconnects.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_mutual_tls_share_bookings_and_refuse_other_certificates() {
    let fleet = fleet(2).await;
    let dir = TempDir::new("replicas-tls");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let pool = Ca::new("kvpick pool CA");
    let other = Ca::new("another pool's CA");

    // Both ways of naming a peer: A's certificate carries only its IP,
    // and B checks A against the address it dials; B's carries only the
    // peer service's DNS name, and A checks B against that name.
    let (a_dir, b_dir, c_dir) = (dir.path("a"), dir.path("b"), dir.path("c"));
    secret_dir(&a_dir, &pool.issue(&["127.0.0.1"]), &pool.pem);
    secret_dir(&b_dir, &pool.issue(&[SERVICE_NAME]), &pool.pem);
    let ports = [free_port(), free_port()];
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let a = replica_with(&file, ports[0], &peers, &tls_settings(&a_dir, Some(SERVICE_NAME))).await;
    let b = replica_with(&file, ports[1], &peers, &tls_settings(&b_dir, None)).await;
    wait_for("each replica streaming to the other over TLS", || async { links_up(&a).await && links_up(&b).await })
        .await;

    let (mut on_a, client_a) = open(&a).await;
    let picked_a = pick(&mut on_a, &body(&text("alpha"))).await;
    wait_for("A's booking held on B", || async { b.service().peer_bookings() == 1 }).await;
    assert!(prefill_on(&b, &picked_a).await > 0, "B counts A's booking on the worker A picked");

    // C trusts the pool's CA (so it would accept A's and B's certificates)
    // and holds the right token, but its own certificate is another CA's.
    secret_dir(&c_dir, &other.issue(&["127.0.0.1"]), &pool.pem);
    let c = replica_with(&file, 0, &peers, &tls_settings(&c_dir, Some(SERVICE_NAME))).await;
    let (mut on_c, client_c) = open(&c).await;
    pick(&mut on_c, &body(&text("charlie"))).await;
    assert_eq!(c.service().active_reservations(), 1, "booked on C");
    // Each of its two links refused at least twice.
    wait_for("C refused by both peers, again and again", || async { reconnects(&c) >= 4 }).await;
    assert!(!links_up(&c).await);
    assert_eq!((a.service().peer_bookings(), b.service().peer_bookings()), (0, 1), "C's booking got through");

    // A caller trusting the pool's CA but presenting no certificate, and
    // one presenting another CA's: refused at the handshake. The same call
    // with a certificate the pool's CA signed goes through.
    let trusting = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&pool.pem)).domain_name(SERVICE_NAME);
    let b_addr = SocketAddr::from(([127, 0, 0, 1], ports[1]));
    let none = empty_exchange(b_addr, trusting()).await;
    assert!(none.is_err(), "no client certificate, yet {none:?}");
    let (cert, key) = other.issue(&["127.0.0.1"]);
    let foreign = empty_exchange(b_addr, trusting().identity(Identity::from_pem(&cert, &key))).await;
    assert!(foreign.is_err(), "another CA's certificate, yet {foreign:?}");
    let (cert, key) = pool.issue(&["127.0.0.1"]);
    let signed = empty_exchange(b_addr, trusting().identity(Identity::from_pem(&cert, &key))).await;
    assert_eq!(signed, Ok(()));
    // B's certificate is checked against the name asked for: another
    // name fails even with a good client certificate.
    let misnamed = trusting().domain_name("kvpick-peers.elsewhere.svc").identity(Identity::from_pem(&cert, &key));
    let misnamed = empty_exchange(b_addr, misnamed).await;
    assert!(misnamed.is_err(), "B's certificate passed for a name it does not carry: {misnamed:?}");

    finish_response(&mut on_a).await;
    finish_response(&mut on_c).await;
    wait_for("every booking freed", || async {
        [&a, &b, &c].iter().all(|app| app.service().active_reservations() == 0 && app.service().peer_bookings() == 0)
    })
    .await;
    drop((on_a, on_c, client_a, client_c));
    for app in [a, b, c] {
        app.shutdown().await;
    }
    fleet.shutdown().await;
}

#[tokio::test]
async fn unusable_peer_certificates_stop_the_start_with_the_reason() {
    let fleet = fleet(1).await;
    let dir = TempDir::new("replicas-tls-bad");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0]);
    let peers = format!("127.0.0.1:{}", free_port());
    let start = |extra: Vec<(&'static str, String)>| {
        let file = file.clone();
        let peers = peers.clone();
        async move {
            let mut values = var::Values::loopback_static(&file);
            values.set(var::PEERS, peers);
            values.set(var::REPLICA_SYNC_PORT, "0");
            for (name, value) in extra {
                values.set(name, value);
            }
            match ServeConfig::from_values(&values) {
                Err(error) => error.to_string(),
                Ok(config) => match App::start(config).await {
                    Err(error) => error.to_string(),
                    Ok(app) => {
                        app.shutdown().await;
                        "started".to_owned()
                    }
                },
            }
        }
    };

    // No such files.
    let missing = start(tls_settings(&dir.path("none"), None)).await;
    assert!(missing.contains(var::PEER_TLS_DIR) && missing.contains("tls.crt"), "{missing}");
    // Files that are not PEM.
    let garbage = dir.path("garbage");
    secret_dir(&garbage, &("not a certificate".into(), "not a key".into()), "not a CA");
    let refused = start(tls_settings(&garbage, None)).await;
    assert!(refused.contains(var::PEER_TLS_DIR) && refused.contains("no PEM CERTIFICATE"), "{refused}");
    // A key that does not parse under a real certificate.
    let ca = Ca::new("CA");
    let (cert, _) = ca.issue(&["127.0.0.1"]);
    let broken = dir.path("broken");
    let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_owned();
    secret_dir(&broken, &(cert, key), &ca.pem);
    let refused = start(tls_settings(&broken, None)).await;
    assert!(refused.contains(var::PEER_TLS_DIR) && refused.contains("not usable"), "{refused}");
    // A server name with no certificates (named as it was given: a flag).
    let alone = start(vec![(var::PEER_TLS_SERVER_NAME, SERVICE_NAME.to_owned())]).await;
    assert!(alone.contains("--peer-tls-server-name") && alone.contains(var::PEER_TLS_DIR), "{alone}");
    fleet.shutdown().await;
}
