//! Candidate restrictions: the gateway's subset hint (a list or a comma
//! string, `ip` or `ip:port`) and the GAIE conformance hooks.

use crate::ext_proc_support::*;
use kvpick_ext_proc::ExtProcConfig;
use kvpick_ext_proc::headers::{CONFORMANCE_SELECTION, CONFORMANCE_SERVED};

/// Picks one chat request with the subset `hint` attached to its headers;
/// returns the pick, or the immediate response's status.
async fn pick_with_subset(h: &Harness, hint: kvpick_proto::protobuf::Value) -> Result<String, u16> {
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    call.send(with_subset(chat_headers(), hint));
    call.send(request_body(chat(&words("subset", 10)).as_bytes(), true));
    let answer = call.recv().await;
    let result = match immediate(&answer) {
        Some((status, _, _)) => Err(status),
        None => Ok(destination(&answer).expect("a pick")),
    };
    drop((call, client));
    h.wait_all_freed().await;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subset_as_list_and_as_comma_string() {
    let h = Harness::start(Options::default()).await;
    let only = endpoint(1).to_string();
    for _ in 0..5 {
        assert_eq!(pick_with_subset(&h, list(&[&only])).await, Ok(only.clone()));
    }
    // A comma string, with a bare IP (any port) and spaces.
    let csv = format!("{} , 127.0.0.99:1", endpoint(2).ip());
    for _ in 0..5 {
        assert_eq!(pick_with_subset(&h, string(&csv)).await, Ok(endpoint(2).to_string()));
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_match_picks_among_the_known_ones() {
    let h = Harness::start(Options::default()).await;
    let (a, b) = (endpoint(0).to_string(), endpoint(2).to_string());
    for _ in 0..6 {
        let picked = pick_with_subset(&h, list(&["127.0.0.98:8000", &a, "not-an-ip", &b])).await;
        assert!(picked == Ok(a.clone()) || picked == Ok(b.clone()), "{picked:?}");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_but_unmatched_or_empty_subset_is_503() {
    let h = Harness::start(Options::default()).await;
    assert_eq!(pick_with_subset(&h, list(&["127.0.0.98:8000"])).await, Err(503));
    // Right IP, wrong port.
    assert_eq!(pick_with_subset(&h, string("127.0.0.10:9999")).await, Err(503));
    assert_eq!(pick_with_subset(&h, list(&[])).await, Err(503));
    assert_eq!(pick_with_subset(&h, string("")).await, Err(503));
    assert_eq!(h.metrics.snapshot().requests(503), 4);
    h.stop().await;
}

fn conformance() -> Options {
    Options { config: ExtProcConfig { conformance_hooks: true, ..Options::default().config }, ..Options::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_header_restricts_and_served_endpoint_is_echoed() {
    let h = Harness::start(conformance()).await;
    let mut client = h.client().await;
    let wanted = endpoint(2);
    for selection in [wanted.to_string(), wanted.ip().to_string(), format!("127.0.0.98, {}", wanted.ip())] {
        let mut call = Call::open(&mut client).await;
        call.send(request_headers("GET", "/", &[(CONFORMANCE_SELECTION, &selection)], true, full_duplex()));
        assert_eq!(destination(&call.recv().await), Some(wanted.to_string()), "{selection}");
        call.send(response_headers("200", "text/plain", Some(&wanted.to_string()), false));
        let answer = call.recv().await;
        assert_eq!(set_header(&answer, CONFORMANCE_SERVED).map(|(v, _)| v), Some(wanted.to_string()));
        drop(call);
    }
    // Missing metadata is reported, as GAIE's conformance EPP does.
    let mut call = Call::open(&mut client).await;
    call.send(request_headers("GET", "/", &[], true, full_duplex()));
    assert!(destination(&call.recv().await).is_some());
    call.send(response_headers("200", "text/plain", None, true));
    let answer = call.recv().await;
    assert_eq!(set_header(&answer, CONFORMANCE_SERVED).map(|(v, _)| v), Some("fail: missing envoy lb metadata".into()));
    // Selection naming no known endpoint (or nothing): 503.
    let mut none = Call::open(&mut client).await;
    none.send(request_headers("GET", "/", &[(CONFORMANCE_SELECTION, "127.0.0.98")], true, full_duplex()));
    assert_eq!(immediate(&none.recv().await).map(|(s, _, _)| s), Some(503));
    drop((call, none, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_header_ipv6_with_and_without_brackets() {
    let h = Harness::start(conformance()).await;
    let v6: std::net::SocketAddr = "[::1]:8001".parse().expect("address");
    h.add_worker_at(9, v6).await;
    let mut client = h.client().await;
    for selection in ["[::1]:8001", "[::1]", "::1", "127.0.0.98,::1"] {
        let mut call = Call::open(&mut client).await;
        call.send(request_headers("GET", "/", &[(CONFORMANCE_SELECTION, selection)], true, full_duplex()));
        assert_eq!(destination(&call.recv().await), Some(v6.to_string()), "{selection}");
    }
    drop(client);
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_header_and_subset_intersect() {
    let h = Harness::start(conformance()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let subset = list(&[&endpoint(0).to_string(), &endpoint(1).to_string()]);
    let selection = format!("{},{}", endpoint(1).ip(), endpoint(2).ip());
    let headers = request_headers("GET", "/", &[(CONFORMANCE_SELECTION, &selection)], true, full_duplex());
    call.send(with_subset(headers, subset));
    assert_eq!(destination(&call.recv().await), Some(endpoint(1).to_string()));
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_hooks_are_off_by_default() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    call.send(request_headers("GET", "/", &[(CONFORMANCE_SELECTION, "127.0.0.98")], true, full_duplex()));
    assert!(destination(&call.recv().await).is_some(), "the header is ignored");
    call.send(response_headers("200", "text/plain", Some("127.0.0.10:8000"), true));
    assert_eq!(set_header(&call.recv().await, CONFORMANCE_SERVED), None);
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}
