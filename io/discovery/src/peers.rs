//! Peer kvpick replicas, from the EndpointSlices of their Service
//! (`kubernetes.io/service-name=<DYN_EPP_PEER_SERVICE>`), for replica sync.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The Service port name whose number, when a slice has it, is the peers'
/// sync port (Dynamo's replica-sync port name).
pub(crate) const SYNC_PORT_NAME: &str = "replica-agg";

/// The peer addresses one slice contributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SliceFacts {
    pub peers: Vec<SocketAddr>,
}

impl SliceFacts {
    /// The ready endpoints of `slice` as `ip:sync_port`, leaving out
    /// `own_ip`, terminating endpoints and every address of the other
    /// family (an FQDN slice gives none). An endpoint whose `ready`
    /// condition is unset counts as ready, as the EndpointSlice API asks.
    /// kvpick's peer Service publishes replicas not yet ready (they are
    /// `ready` in its slices), so that peers send a starting replica their
    /// bookings before it reports ready; a terminating one is `ready` there
    /// too, and left out here. The port is the slice's `replica-agg`
    /// port if it names one, else `default_port`. `None` for a slice
    /// without a name.
    pub fn from_slice(slice: &EndpointSlice, own_ip: IpAddr, default_port: u16) -> Option<(String, SliceFacts)> {
        let name = slice.metadata.name.clone().filter(|n| !n.is_empty())?;
        let family_ok = match slice.address_type.as_str() {
            "IPv4" => own_ip.is_ipv4(),
            "IPv6" => own_ip.is_ipv6(),
            _ => false,
        };
        let port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(SYNC_PORT_NAME))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .unwrap_or(default_port);
        let mut peers = Vec::new();
        if family_ok {
            for ep in &slice.endpoints {
                let conditions = ep.conditions.as_ref();
                if conditions.and_then(|c| c.ready) == Some(false)
                    || conditions.and_then(|c| c.terminating) == Some(true)
                {
                    continue;
                }
                for addr in &ep.addresses {
                    match addr.parse::<IpAddr>() {
                        Ok(ip) if ip != own_ip && ip.is_ipv4() == own_ip.is_ipv4() => {
                            peers.push(SocketAddr::new(ip, port));
                        }
                        _ => {}
                    }
                }
            }
        }
        Some((name, SliceFacts { peers }))
    }
}

/// The union of every slice's peers.
pub(crate) fn peer_set<'a>(slices: impl IntoIterator<Item = &'a SliceFacts>) -> BTreeSet<SocketAddr> {
    slices.into_iter().flat_map(|s| s.peers.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ready_peers_of_our_family_but_us() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "epp-abc"},
            "addressType": "IPv4",
            "ports": [{"name": "grpc", "port": 9002}, {"name": "replica-agg", "port": 9192}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"]},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
                // As a Service publishing not-ready addresses lists a
                // terminating pod.
                {"addresses": ["10.0.0.4"], "conditions": {"ready": true, "serving": true, "terminating": true}},
                {"addresses": ["10.0.0.9", "bogus"]},
            ],
        }))
        .unwrap();
        let own: IpAddr = "10.0.0.9".parse().unwrap();
        let (name, facts) = SliceFacts::from_slice(&slice, own, 9092).unwrap();
        assert_eq!(name, "epp-abc");
        let want: Vec<SocketAddr> = vec!["10.0.0.1:9192".parse().unwrap(), "10.0.0.2:9192".parse().unwrap()];
        assert_eq!(facts.peers, want);

        // Another family, or no sync port named: default port / nothing.
        let v6: IpAddr = "fd00::9".parse().unwrap();
        assert!(SliceFacts::from_slice(&slice, v6, 9092).unwrap().1.peers.is_empty());
        let plain: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "s"}, "addressType": "IPv6",
            "endpoints": [{"addresses": ["fd00::1"]}],
        }))
        .unwrap();
        let (_, f) = SliceFacts::from_slice(&plain, v6, 9092).unwrap();
        assert_eq!(f.peers, vec!["[fd00::1]:9092".parse::<SocketAddr>().unwrap()]);
        assert_eq!(peer_set([&facts, &f]).len(), 3);
    }
}
