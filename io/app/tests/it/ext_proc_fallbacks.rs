//! The opt-in ordered fallback list: `ip:port,ip:port,…` in both the header
//! and the `envoy.lb` metadata, the pick first, then the next cheapest;
//! off by default, since agentgateway rejects a list.

use crate::ext_proc_support::*;
use kvpick_core::RouterConfig;

async fn destination_for(router: RouterConfig) -> String {
    let h = Harness::start(Options { router, ..Options::default() }).await;
    // Worker 1 holds the prompt's prefix: it must come first.
    let body = chat(&words("shared", 24));
    h.cache_on(1, &body).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let destination = pick(&mut call, &body).await;
    finish_response(&mut call).await;
    h.wait_all_freed().await;
    drop((call, client));
    h.stop().await;
    destination
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_by_default() {
    let destination = destination_for(RouterConfig::default()).await;
    assert_eq!(destination, endpoint(1).to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_fallbacks_follow_the_pick_cheapest_first() {
    let destination = destination_for(RouterConfig { fallbacks: 5, ..RouterConfig::default() }).await;
    let list: Vec<&str> = destination.split(',').collect();
    // Three workers: the pick and the two others, no more, no repeats.
    assert_eq!(list.len(), 3, "{destination}");
    assert_eq!(list[0], endpoint(1).to_string());
    let mut rest: Vec<String> = list[1..].iter().map(|s| (*s).to_owned()).collect();
    rest.sort();
    let mut others = vec![endpoint(0).to_string(), endpoint(2).to_string()];
    others.sort();
    assert_eq!(rest, others);
}
