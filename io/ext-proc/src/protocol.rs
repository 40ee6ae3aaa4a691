//! Which body modes the gateway runs the ext_proc filter in, and whether
//! kvpick can work with them.
//!
//! The pick needs the whole request body before the request headers can
//! be answered. That works in FULL_DUPLEX_STREAMED (the headers answer is
//! held until the body has arrived, then the body is echoed back) and in
//! BUFFERED (headers answered at once, the pick rides on the body answer:
//! Envoy applies header mutations from a body answer only in BUFFERED
//! mode). Any other request body mode would make the gateway wait for a
//! headers answer kvpick cannot give, until its message timeout: refused
//! up front with `FAILED_PRECONDITION`. The response body may use any mode.

use kvpick_proto::ext_proc::ProtocolConfiguration;
use kvpick_proto::ext_proc::mode::BodySendMode;

use crate::config::AssumedBodyMode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modes {
    pub request_body: BodySendMode,
    pub response_body: BodySendMode,
}

impl Modes {
    /// For gateways that send no `protocol_config`.
    pub fn assumed(mode: AssumedBodyMode) -> Modes {
        let request_body = match mode {
            AssumedBodyMode::FullDuplexStreamed => BodySendMode::FullDuplexStreamed,
            AssumedBodyMode::Buffered => BodySendMode::Buffered,
        };
        // Echoing is only required (and only valid) in full-duplex mode.
        Modes { request_body, response_body: request_body }
    }

    pub fn from_protocol_config(config: &ProtocolConfiguration) -> Result<Modes, tonic::Status> {
        let mode = |value: i32| BodySendMode::try_from(value).ok();
        let request_body = mode(config.request_body_mode);
        let response_body = mode(config.response_body_mode);
        match (request_body, response_body) {
            (Some(request @ (BodySendMode::FullDuplexStreamed | BodySendMode::Buffered)), Some(response)) => {
                Ok(Modes { request_body: request, response_body: response })
            }
            (Some(request), Some(_)) => Err(tonic::Status::failed_precondition(format!(
                "request_body_mode {} cannot work with kvpick: the endpoint is picked from the whole request \
                 body, so configure FULL_DUPLEX_STREAMED (what GAIE gateways use) or BUFFERED",
                request.as_str_name()
            ))),
            _ => Err(tonic::Status::invalid_argument(format!(
                "unknown body mode in protocol_config (request {}, response {})",
                config.request_body_mode, config.response_body_mode
            ))),
        }
    }

    pub fn request_full_duplex(&self) -> bool {
        self.request_body == BodySendMode::FullDuplexStreamed
    }

    pub fn response_full_duplex(&self) -> bool {
        self.response_body == BodySendMode::FullDuplexStreamed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(request: BodySendMode, response: BodySendMode) -> ProtocolConfiguration {
        ProtocolConfiguration {
            request_body_mode: request as i32,
            response_body_mode: response as i32,
            send_body_without_waiting_for_header_response: true,
        }
    }

    #[test]
    fn accepts_full_duplex_and_buffered_only() {
        use BodySendMode::*;
        assert!(Modes::from_protocol_config(&config(FullDuplexStreamed, FullDuplexStreamed)).is_ok());
        assert!(Modes::from_protocol_config(&config(Buffered, None)).is_ok());
        for bad in [None, Streamed, BufferedPartial] {
            let status = Modes::from_protocol_config(&config(bad, FullDuplexStreamed)).err();
            assert_eq!(status.map(|s| s.code()), Some(tonic::Code::FailedPrecondition), "{bad:?}");
        }
        let unknown = ProtocolConfiguration { request_body_mode: 99, ..Default::default() };
        assert!(Modes::from_protocol_config(&unknown).is_err());
    }
}
