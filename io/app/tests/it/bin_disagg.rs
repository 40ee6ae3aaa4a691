//! `kvpick serve` in front of a disaggregated fleet from a workers file
//! with roles: one prefill engine and two decode engines (simulated vLLM).
//! A long prompt goes to a decode engine with the prefill engine in
//! `x-prefiller-host-port`; a short one is served whole; the prefill
//! engine's KV events reach the prefill selector; both legs are released.

use kvpick_test_support::gateway::Gateway;

use crate::bin_support::{TempDir, chat, fleet, http_post, scrape, serve, until, value, write_roled_workers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roled_fleet_splits_long_prompts_and_routes_each_role_its_events() {
    let fleet = fleet(3).await;
    let dir = TempDir::new("disagg");
    let file = dir.path("workers.yaml");
    let endpoints = fleet.endpoints();
    write_roled_workers(&file, &fleet);
    let mut kvpick = serve(&file, &["--pd-threshold-tokens", "64"]);
    let log = kvpick.drain_log();
    assert!(log.iter().any(|l| l.contains("prefill workers get a selector of their own")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("worker added") && l.contains("\"role\":\"prefill\"")), "{log:?}");

    let (prefill, decode) = (endpoints[0].http, [endpoints[1].http, endpoints[2].http]);
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let long = chat(&"Walk me through the history of the printing press, step by step. ".repeat(20));
    let exchange = gateway.post("/v1/chat/completions", &long).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
    assert!(exchange.endpoint.is_some_and(|e| decode.contains(&e)), "decoded on {:?}", exchange.endpoint);
    assert_eq!(exchange.prefiller, Some(prefill), "prefilled on the prefill engine");

    let short = chat("hello there");
    let exchange = gateway.post("/v1/chat/completions", &short).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exchange.status, 200);
    assert!(exchange.endpoint.is_some_and(|e| decode.contains(&e)));
    assert_eq!(exchange.prefiller, None, "too short to split");

    let routes = |s: &prometheus_parse::Scrape, route, reason: &str| {
        let labels: Vec<(&str, &str)> =
            if reason.is_empty() { vec![("route", route)] } else { vec![("route", route), ("reason", reason)] };
        value(s, "kvpick_pd_routes_total", &labels)
    };
    until(&kvpick, "both legs released", |s| {
        value(s, "kvpick_prefill_reservations_active", &[]) == 0.0 && value(s, "kvpick_reservations_active", &[]) == 0.0
    })
    .await;
    let after = scrape(kvpick.metrics).await;
    assert_eq!(routes(&after, "disaggregated", ""), 1.0);
    assert_eq!(routes(&after, "aggregated", "short_uncached"), 1.0);
    assert_eq!(value(&after, "kvpick_prefill_workers", &[]), 1.0);
    assert_eq!(value(&after, "kvpick_prefill_selections_total", &[]), 1.0);

    // The prefill engine computes a prompt (as a sidecar's prefill leg
    // would make it): its KV events land in the prefill selector's index.
    let (status, body) = http_post(prefill, "/v1/chat/completions", &long).await;
    assert_eq!(status, 200, "{body}");
    let worker = prefill.to_string();
    until(&kvpick, "the prefill engine's blocks indexed", |s| {
        value(s, "kvpick_worker_cached_blocks", &[("worker", &worker)]) > 0.0
    })
    .await;
    let after = scrape(kvpick.metrics).await;
    assert_eq!(value(&after, "kvpick_index_events_rejected_total", &[]), 0.0, "no event went to the wrong selector");
    fleet.shutdown().await;
}
