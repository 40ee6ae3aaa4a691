//! The wire types kvpick speaks, generated with prost and tonic: Envoy's
//! `ext_proc` v3 (how every gateway asks kvpick for an endpoint) and
//! `grpc.health.v1`.
//!
//! Re-exports only, under short names, so the rest of the workspace never
//! spells `envoy_types::pb::envoy::service::ext_proc::v3`. Must hold no logic
//! and no I/O. See README.md for why the Envoy types come from the
//! `envoy-types` crate rather than vendored `.proto` files.

/// `envoy.service.ext_proc.v3`: `ProcessingRequest`/`ProcessingResponse`
/// and the tonic `ExternalProcessor` server and client.
pub mod ext_proc {
    pub use envoy_types::pb::envoy::service::ext_proc::v3::*;

    /// The filter configuration's `ProcessingMode` (body send modes).
    pub mod mode {
        pub use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
        pub use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
            BodySendMode, HeaderSendMode,
        };
    }
}

/// `envoy.config.core.v3`: headers, header mutations, metadata.
pub mod core {
    pub use envoy_types::pb::envoy::config::core::v3::{
        HeaderMap, HeaderValue, HeaderValueOption, Metadata, header_value_option::HeaderAppendAction,
    };
}

/// `envoy.type.v3`: HTTP status codes for immediate responses.
pub mod http_status {
    pub use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
}

/// `google.protobuf` well-known types used in metadata.
pub mod protobuf {
    pub use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
}

/// `grpc.health.v1`: messages, the tonic client, and the server with its
/// status reporter.
pub mod health {
    pub use tonic_health::ServingStatus;
    pub use tonic_health::pb::*;
    pub use tonic_health::server::{HealthReporter, HealthService, health_reporter};
}

/// `kvpick.peer.v1`: what kvpick replicas send each other (bookings).
pub mod peer;
