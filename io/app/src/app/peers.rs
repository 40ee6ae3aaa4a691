//! The peer replicas to dial: those listed at start (`--peers`), looked up
//! again while kvpick runs when they are named rather than numbered, and
//! in Kubernetes mode those of the peer Service.
//!
//! A listed name is resolved every [`RESOLVE_EVERY`]: a peer restarted
//! under a new IP (Compose, a headless Service named directly, a VM behind
//! DNS) is dialed at its new address and no longer at its old one. A
//! lookup that fails keeps what the name last resolved to: a DNS hiccup
//! must not cut a healthy peer.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often listed names are looked up again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(10);
/// A lookup not answered by then counts as failed.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// One entry of the peer list.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ListedPeer {
    Addr(SocketAddr),
    /// `host:port`, looked up while kvpick runs.
    Name(String),
}

/// Parses `host:port` entries, comma-separated; an entry that is not one
/// says why. Names are not looked up here (DNS may not answer yet at
/// start: peers often start together).
pub fn parse_list(list: &str) -> Result<Vec<ListedPeer>, String> {
    let mut peers = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if let Ok(addr) = entry.parse::<SocketAddr>() {
            peers.push(ListedPeer::Addr(addr));
            continue;
        }
        let named = entry.rsplit_once(':').filter(|(host, port)| {
            !host.is_empty()
                && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
                && port.parse::<u16>().is_ok_and(|p| p != 0)
        });
        if named.is_none() {
            return Err(format!("expected host:port entries, comma-separated; {entry:?} is not one"));
        }
        peers.push(ListedPeer::Name(entry.to_owned()));
    }
    if peers.is_empty() {
        return Err("expected host:port entries, comma-separated".into());
    }
    Ok(peers)
}

/// The listed peers' addresses now: numbered ones as they are, names as
/// they resolve, or as they last did (`last`, updated) when the lookup
/// fails.
async fn resolve<F, Fut>(
    listed: &[ListedPeer],
    last: &mut BTreeMap<String, BTreeSet<SocketAddr>>,
    lookup: F,
) -> BTreeSet<SocketAddr>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<Vec<SocketAddr>>>,
{
    let mut addrs = BTreeSet::new();
    for peer in listed {
        match peer {
            ListedPeer::Addr(addr) => {
                addrs.insert(*addr);
            }
            ListedPeer::Name(name) => {
                match tokio::time::timeout(LOOKUP_TIMEOUT, lookup(name.clone())).await {
                    Ok(Ok(found)) => {
                        let found: BTreeSet<SocketAddr> = found.into_iter().collect();
                        if last.get(name) != Some(&found) {
                            tracing::info!(peer = %name, addrs = ?found, "replica sync: a listed peer resolved");
                        }
                        last.insert(name.clone(), found);
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(peer = %name, %error, kept = ?last.get(name), "replica sync: a listed peer did not resolve; its last addresses kept");
                    }
                    Err(_) => {
                        tracing::warn!(peer = %name, kept = ?last.get(name), "replica sync: a listed peer's lookup timed out; its last addresses kept");
                    }
                }
                addrs.extend(last.get(name).into_iter().flatten().copied());
            }
        }
    }
    addrs
}

/// Keeps `peers` at the listed peers (resolved again every
/// [`RESOLVE_EVERY`]) together with what `discovered` holds as it changes.
/// No task when there is nothing to follow (numbers only, no peer
/// Service): `peers` then keeps the listed set.
pub fn follow(
    listed: Vec<ListedPeer>,
    discovered: Option<watch::Receiver<BTreeSet<SocketAddr>>>,
    peers: watch::Sender<BTreeSet<SocketAddr>>,
) -> Option<JoinHandle<()>> {
    let named = listed.iter().any(|p| matches!(p, ListedPeer::Name(_)));
    if !named && discovered.is_none() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut discovered = discovered;
        // What discovery last listed: kept when its watch stops.
        let mut found = discovered.as_mut().map(|d| d.borrow_and_update().clone()).unwrap_or_default();
        let mut last = BTreeMap::new();
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + RESOLVE_EVERY, RESOLVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Numbers only need no lookup: the first one gives the set for good.
        let mut resolved = resolve(&listed, &mut last, system_lookup).await;
        loop {
            let mut all = resolved.clone();
            all.extend(found.iter().copied());
            peers.send_if_modified(|held| {
                let differs = *held != all;
                if differs {
                    *held = all;
                }
                differs
            });
            if peers.is_closed() {
                break;
            }
            tokio::select! {
                _ = tick.tick(), if named => resolved = resolve(&listed, &mut last, system_lookup).await,
                changed = async {
                    match discovered.as_mut() {
                        Some(d) => d.changed().await,
                        None => std::future::pending().await,
                    }
                } => match (changed, discovered.as_mut()) {
                    (Ok(()), Some(d)) => found = d.borrow_and_update().clone(),
                    // The watch stopped: its last set stays.
                    _ => discovered = None,
                },
                () = peers.closed() => break,
            }
        }
    }))
}

/// The system's resolver (getaddrinfo, on tokio's blocking pool).
async fn system_lookup(name: String) -> std::io::Result<Vec<SocketAddr>> {
    Ok(tokio::net::lookup_host(name).await?.collect())
}

/// The listed peers with numbers, for the first set (before any lookup).
pub fn numbered(listed: &[ListedPeer]) -> BTreeSet<SocketAddr> {
    listed
        .iter()
        .filter_map(|p| match p {
            ListedPeer::Addr(addr) => Some(*addr),
            ListedPeer::Name(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_numbers_or_names_with_ports() {
        let parsed = parse_list(" 10.0.0.1:9092, [::1]:9092 ,kvpick-1.peers:9092,, localhost:1").unwrap_or_default();
        assert_eq!(
            parsed,
            vec![
                ListedPeer::Addr("10.0.0.1:9092".parse().unwrap_or_else(|e| panic!("{e}"))),
                ListedPeer::Addr("[::1]:9092".parse().unwrap_or_else(|e| panic!("{e}"))),
                ListedPeer::Name("kvpick-1.peers:9092".into()),
                ListedPeer::Name("localhost:1".into()),
            ]
        );
        for bad in ["", " , ", "kvpick-1", "kvpick-1:", ":9092", "kvpick-1:0", "kvpick-1:70000", "a b:1", "h/x:1"] {
            assert!(parse_list(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test]
    async fn names_resolve_and_a_failed_lookup_keeps_the_last_addresses() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{e}"));
        // A resolver of the test's own (no query leaves the machine):
        // `peer-b` moves from .2 to .3, `peer-c` fails after its first answer.
        let answers = std::sync::Mutex::new(vec![
            ("peer-b:7002", Ok(vec![addr("10.1.0.2:7002")])),
            ("peer-c:7003", Ok(vec![addr("10.1.0.4:7003"), addr("10.1.0.5:7003")])),
            ("peer-b:7002", Ok(vec![addr("10.1.0.3:7002")])),
            ("peer-c:7003", Err(std::io::Error::other("no such host"))),
        ]);
        let lookup = |name: String| {
            let mut answers = answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let (asked, answer) = answers.remove(0);
            assert_eq!(asked, name);
            std::future::ready(answer)
        };
        let listed = parse_list("10.1.0.1:7001,peer-b:7002,peer-c:7003").unwrap_or_default();
        let mut last = BTreeMap::new();
        let first = resolve(&listed, &mut last, &lookup).await;
        let want = ["10.1.0.1:7001", "10.1.0.2:7002", "10.1.0.4:7003", "10.1.0.5:7003"];
        assert_eq!(first, want.iter().map(|a| addr(a)).collect());
        // peer-b moved: its old address goes; peer-c's lookup failed: kept.
        let second = resolve(&listed, &mut last, &lookup).await;
        let want = ["10.1.0.1:7001", "10.1.0.3:7002", "10.1.0.4:7003", "10.1.0.5:7003"];
        assert_eq!(second, want.iter().map(|a| addr(a)).collect());
        assert_eq!(numbered(&listed), BTreeSet::from([addr("10.1.0.1:7001")]));
    }

    #[tokio::test]
    async fn discovered_peers_join_the_listed_ones_and_stay_when_discovery_stops() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{e}"));
        let listed = parse_list("10.1.0.1:7001").unwrap_or_default();
        let (found_tx, found_rx) = watch::channel(BTreeSet::from([addr("10.2.0.1:7001")]));
        let (peers_tx, mut peers) = watch::channel(BTreeSet::new());
        let task = follow(listed, Some(found_rx), peers_tx).unwrap_or_else(|| panic!("discovery is followed"));
        async fn expect(peers: &mut watch::Receiver<BTreeSet<SocketAddr>>, want: &[&str]) -> bool {
            let want: BTreeSet<SocketAddr> = want.iter().filter_map(|a| a.parse().ok()).collect();
            let wait = tokio::time::timeout(Duration::from_secs(10), peers.wait_for(|held| *held == want));
            wait.await.is_ok_and(|seen| seen.is_ok())
        }
        assert!(expect(&mut peers, &["10.1.0.1:7001", "10.2.0.1:7001"]).await);
        found_tx.send_replace(BTreeSet::from([addr("10.2.0.2:7001")]));
        assert!(expect(&mut peers, &["10.1.0.1:7001", "10.2.0.2:7001"]).await);
        // Discovery's watch stops (its task ended): its last set stays.
        drop(found_tx);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*peers.borrow(), BTreeSet::from([addr("10.1.0.1:7001"), addr("10.2.0.2:7001")]));
        // Nobody reads the set any more: the task ends.
        drop(peers);
        let ended = tokio::time::timeout(Duration::from_secs(10), task).await;
        assert!(ended.is_ok_and(|done| done.is_ok()), "the task did not end");
    }
}
