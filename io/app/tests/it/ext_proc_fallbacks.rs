//! The opt-in ordered fallback list: `ip:port,ip:port,…` in the
//! `envoy.lb` metadata, the pick first, then the next cheapest; the header
//! carries the pick alone unless asked (agentgateway rejects a list there);
//! off by default.

use crate::ext_proc_support::*;
use kvpick_core::RouterConfig;
use kvpick_ext_proc::ExtProcConfig;

/// The header and the metadata of one pick.
async fn destination_for(router: RouterConfig, in_header: bool) -> (String, String) {
    let config = ExtProcConfig { fallbacks_in_header: in_header, ..Options::default().config };
    let h = Harness::start(Options { router, config, ..Options::default() }).await;
    // Worker 1 holds the prompt's prefix: it must come first.
    let body = chat(&words("shared", 24));
    h.cache_on(1, &body).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    call.send(chat_headers());
    call.send(request_body(body.as_bytes(), true));
    let answer = call.recv().await;
    let picked = (destination(&answer).expect("a pick"), destination_metadata(&answer).expect("metadata"));
    call.recv().await;
    finish_response(&mut call).await;
    h.wait_all_freed().await;
    drop((call, client));
    h.stop().await;
    picked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_by_default() {
    let (header, metadata) = destination_for(RouterConfig::default(), false).await;
    assert_eq!(
        (header.as_str(), metadata.as_str()),
        (endpoint(1).to_string().as_str(), endpoint(1).to_string().as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_fallbacks_follow_the_pick_cheapest_first_in_the_metadata() {
    let (header, metadata) = destination_for(RouterConfig { fallbacks: 5, ..RouterConfig::default() }, false).await;
    assert_eq!(header, endpoint(1).to_string(), "the header has the pick alone");
    let list: Vec<&str> = metadata.split(',').collect();
    // Three workers: the pick and the two others, no more, no repeats.
    assert_eq!(list.len(), 3, "{metadata}");
    assert_eq!(list[0], endpoint(1).to_string());
    let mut rest: Vec<String> = list[1..].iter().map(|s| (*s).to_owned()).collect();
    rest.sort();
    let mut others = vec![endpoint(0).to_string(), endpoint(2).to_string()];
    others.sort();
    assert_eq!(rest, others);
    // Asked for: the header carries the same list.
    let (header, metadata) = destination_for(RouterConfig { fallbacks: 5, ..RouterConfig::default() }, true).await;
    assert_eq!(header, metadata);
    assert_eq!(header.split(',').count(), 3);
}
