//! Why a request gets an `ImmediateResponse` instead of a pick, and the one
//! place each reason is mapped to an HTTP status and an OpenAI-style error
//! body.
//!
//! Blame decides the status: the client's fault is 4xx (bad JSON, missing
//! model, body too large, unknown model), our capacity is 429 (retry
//! later), an upstream we depend on is 502/504, no endpoint is 503.

use kvpick_core::SelectError;
use kvpick_proto::ext_proc::{HeaderMutation, ImmediateResponse, ProcessingResponse, processing_response};
use kvpick_proto::http_status::HttpStatus;

use crate::headers::set_header;

/// What went wrong, classified by who is to blame and what the gateway is
/// told (mapped to a status in one place: `TokenizeError::http_status`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeError {
    /// This tokenizer cannot handle this kind of body (e.g. chat on
    /// SGLang's `/tokenize`): not a failure, the policy decides.
    #[error("tokenizer does not support this request: {0}")]
    Unsupported(&'static str),
    #[error("tokenizer unreachable: {0}")]
    Unreachable(String),
    #[error("tokenizer timed out")]
    Timeout,
    /// The engine refused the request (4xx): the client's fault.
    #[error("tokenizer rejected the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    /// The engine failed (5xx), answered something unreadable, or too much.
    #[error("tokenizer failed: {0}")]
    Upstream(String),
}

impl TokenizeError {
    /// The status the gateway gets when the policy is to fail.
    pub fn http_status(&self) -> u16 {
        match self {
            TokenizeError::Unsupported(_) => 400,
            TokenizeError::Unreachable(_) => 503,
            TokenizeError::Timeout => 504,
            TokenizeError::Rejected { .. } => 400,
            TokenizeError::Upstream(_) => 502,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body has no \"model\" string")]
    MissingModel,
    #[error("request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("too many requests in flight at this endpoint picker (limit {limit})")]
    InflightLimit { limit: usize },
    #[error("the gateway's endpoint subset matches no endpoint")]
    EmptySubset,
    #[error("tokenizer: {0}")]
    Tokenizer(TokenizeError),
    #[error("{0}")]
    Select(SelectError),
    /// Its decode worker cannot run a request whole (SGLang's decode mode)
    /// and no prefill worker can take its prefill.
    #[error("no prefill worker can take this request, and its decode worker {decode} runs only disaggregated requests")]
    NoPrefillWorker { decode: std::net::SocketAddr },
}

impl From<TokenizeError> for RequestError {
    fn from(e: TokenizeError) -> Self {
        RequestError::Tokenizer(e)
    }
}

impl From<SelectError> for RequestError {
    fn from(e: SelectError) -> Self {
        RequestError::Select(e)
    }
}

impl RequestError {
    /// The HTTP status the client gets. The only place statuses are chosen.
    ///
    /// - In-flight limit → 429, not 503 (Dynamo's choice): it is our own
    ///   capacity, so the honest answer is "too many requests, retry later"
    ///   (with `retry-after`); gateways commonly retry 503 on another host
    ///   or count it as a backend outage, which would turn an overloaded
    ///   picker into retry storms and hide it behind "no endpoint" errors.
    /// - Unknown model → 404, as OpenAI (`model_not_found`) and vLLM answer
    ///   for a model they do not serve, so clients see the same status with
    ///   or without kvpick in front.
    /// - Duplicate reservation → 500: reservation ids are ours, so a clash
    ///   is our bug, never the client's.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::InvalidJson(_) | RequestError::MissingModel => 400,
            RequestError::BodyTooLarge { .. } => 413,
            RequestError::InflightLimit { .. } => 429,
            RequestError::EmptySubset | RequestError::NoPrefillWorker { .. } => 503,
            RequestError::Tokenizer(e) => e.http_status(),
            RequestError::Select(e) => match e {
                SelectError::NoWorkers | SelectError::NoEligibleWorkers | SelectError::ShuttingDown => 503,
                SelectError::UnknownModel(_) => 404,
                SelectError::QueueFull | SelectError::QueueTimeout | SelectError::Overloaded => 429,
                SelectError::DuplicateReservation(_) => 500,
            },
        }
    }

    /// OpenAI's error `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status() {
            400 | 413 => "invalid_request_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500 => "internal_error",
            502 | 504 => "upstream_error",
            _ => "service_unavailable_error",
        }
    }

    /// Short, space-free reason for the gateway's access log
    /// (`%RESPONSE_CODE_DETAILS%`).
    pub fn details(&self) -> &'static str {
        match self {
            RequestError::InvalidJson(_) => "kvpick_invalid_json",
            RequestError::MissingModel => "kvpick_missing_model",
            RequestError::BodyTooLarge { .. } => "kvpick_body_too_large",
            RequestError::InflightLimit { .. } => "kvpick_inflight_limit",
            RequestError::EmptySubset => "kvpick_empty_subset",
            RequestError::NoPrefillWorker { .. } => "kvpick_no_prefill_worker",
            RequestError::Tokenizer(_) => "kvpick_tokenizer_error",
            RequestError::Select(SelectError::UnknownModel(_)) => "kvpick_unknown_model",
            RequestError::Select(SelectError::QueueFull | SelectError::QueueTimeout) => "kvpick_queue_rejected",
            RequestError::Select(SelectError::Overloaded) => "kvpick_overloaded",
            RequestError::Select(SelectError::DuplicateReservation(_)) => "kvpick_internal_error",
            RequestError::Select(_) => "kvpick_no_endpoint",
        }
    }

    /// `{"error":{"message","type","code"}}`, as OpenAI-compatible servers
    /// answer.
    pub fn body(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "error": { "message": self.to_string(), "type": self.kind(), "code": self.status() }
        });
        body.to_string().into_bytes()
    }

    /// The whole message to the gateway.
    pub fn immediate_response(&self) -> ProcessingResponse {
        let mut headers = vec![set_header("content-type", b"application/json")];
        if self.status() == 429 {
            headers.push(set_header("retry-after", b"1"));
        }
        let immediate = ImmediateResponse {
            status: Some(HttpStatus { code: i32::from(self.status()) }),
            headers: Some(HeaderMutation { set_headers: headers, remove_headers: Vec::new() }),
            body: self.body(),
            grpc_status: None,
            details: self.details().to_owned(),
        };
        ProcessingResponse {
            response: Some(processing_response::Response::ImmediateResponse(immediate)),
            ..Default::default()
        }
    }
}
