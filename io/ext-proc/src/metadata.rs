//! Envoy dynamic metadata in and out: the gateway's candidate subset
//! (`envoy.lb.subset_hint`), the endpoint that served the request
//! (`envoy.lb` on the response path), and the pick kvpick publishes in
//! `envoy.lb` for gateways that route on metadata instead of the header.

use kvpick_proto::core::Metadata;
use kvpick_proto::protobuf::{Kind, Struct, Value};

use crate::endpoints::{Endpoint, parse_csv, parse_list};
use crate::headers::{DESTINATION, DESTINATION_SERVED, DESTINATION_SUBSET};

/// Namespace of the pick (kvpick → gateway) and the served endpoint.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// Namespace of the gateway's candidate subset.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";

fn field<'a>(metadata: Option<&'a Metadata>, namespace: &str, key: &str) -> Option<&'a Value> {
    metadata?.filter_metadata.get(namespace)?.fields.get(key)
}

/// The gateway's subset, if it set one: a list of strings (each possibly
/// itself a comma list) or one comma-separated string, of `ip` or
/// `ip:port`. A set but empty (or unreadable) subset is empty: nothing may
/// serve.
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<Endpoint>> {
    let value = field(metadata, SUBSET_NAMESPACE, DESTINATION_SUBSET)?;
    Some(match &value.kind {
        Some(Kind::StringValue(csv)) => parse_csv(csv),
        Some(Kind::ListValue(list)) => parse_list(list.values.iter().flat_map(|v| match &v.kind {
            Some(Kind::StringValue(s)) => s.split(','),
            _ => "".split(','),
        })),
        _ => Vec::new(),
    })
}

/// What the gateway says served the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// No `envoy.lb` namespace at all.
    NoLbMetadata,
    /// `envoy.lb` without the served key.
    NoServedKey,
    /// The endpoint that served: the last of a comma list (after retries
    /// the gateway appends the endpoint it tried next).
    Endpoint(String),
}

pub fn served_endpoint(metadata: Option<&Metadata>) -> Served {
    let Some(lb) = metadata.and_then(|m| m.filter_metadata.get(LB_NAMESPACE)) else {
        return Served::NoLbMetadata;
    };
    match lb.fields.get(DESTINATION_SERVED).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(s)) => match s.rsplit(',').map(str::trim).find(|s| !s.is_empty()) {
            Some(last) => Served::Endpoint(last.to_owned()),
            None => Served::NoServedKey,
        },
        _ => Served::NoServedKey,
    }
}

fn string(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.to_owned())) }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": destination}}`.
pub fn destination_metadata(destination: &str) -> Struct {
    let lb = Struct { fields: [(DESTINATION.to_owned(), string(destination))].into_iter().collect() };
    Struct { fields: [(LB_NAMESPACE.to_owned(), Value { kind: Some(Kind::StructValue(lb)) })].into_iter().collect() }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use kvpick_proto::protobuf::ListValue;

    use super::super::endpoints::to_filter;
    use super::*;

    fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
        let ns = Struct { fields: [(key.to_owned(), value)].into_iter().collect() };
        Metadata { filter_metadata: [(namespace.to_owned(), ns)].into_iter().collect(), ..Default::default() }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn subset_as_list_and_as_string() {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue { values: vec![string("10.0.0.1:8000"), string("10.0.0.2")] })),
        };
        let m = metadata(SUBSET_NAMESPACE, DESTINATION_SUBSET, list);
        let f = to_filter(&subset_hint(Some(&m)).unwrap_or_default());
        assert!(f.allows(&addr("10.0.0.1:8000")) && f.allows(&addr("10.0.0.2:9")) && !f.allows(&addr("10.0.0.1:1")));

        let m = metadata(SUBSET_NAMESPACE, DESTINATION_SUBSET, string("10.0.0.3:1, 10.0.0.4"));
        let f = to_filter(&subset_hint(Some(&m)).unwrap_or_default());
        assert!(f.allows(&addr("10.0.0.3:1")) && f.allows(&addr("10.0.0.4:5")));

        assert_eq!(subset_hint(None), None);
        let empty =
            metadata(SUBSET_NAMESPACE, DESTINATION_SUBSET, Value { kind: Some(Kind::ListValue(ListValue::default())) });
        assert!(subset_hint(Some(&empty)).is_some_and(|f| f.is_empty()));
    }

    #[test]
    fn served_is_the_last_of_a_list() {
        assert_eq!(served_endpoint(None), Served::NoLbMetadata);
        let m = metadata(LB_NAMESPACE, DESTINATION_SERVED, string("10.0.0.1:80,10.0.0.2:80"));
        assert_eq!(served_endpoint(Some(&m)), Served::Endpoint("10.0.0.2:80".into()));
        let m = metadata(LB_NAMESPACE, "other", string("x"));
        assert_eq!(served_endpoint(Some(&m)), Served::NoServedKey);
    }
}
