//! One request through the sidecar: the P/D routes run their engine's
//! protocol (`protocol`), every other request goes to the decode engine as
//! it came. Each answer says on its headers how the request ran (the
//! hand-off the EPP reads, `x-kvpick-pd`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use kvpick_ext_proc::headers::{PD_HANDOFF, PD_REASON, PREFILL_MS};
use serde_json::Value;

use crate::body::{Answer, Boxed, full};
use crate::config::{EngineKind, OnPrefillFailure, SidecarConfig};
use crate::engines::{Engines, LegError};
use crate::error::{openai_error, pd_failure};
use crate::headers::{REQUEST_ID, request_id, strip_for_engine, strip_from_engine};
use crate::local_engine::LocalEngine;
use crate::metrics::{Aggregated, Mode, PrefillFailure, SidecarMetrics, Stage};
use crate::prefiller::Prefiller;
use crate::protocol::{Body, Route, Unusable, sglang, streamed, trtllm, vllm};

/// What every request's handling shares.
pub struct Shared {
    pub config: SidecarConfig,
    /// The prefill engines (any address a prefiller names).
    pub engines: Engines,
    /// The local decode engine.
    pub decode_engine: Arc<LocalEngine>,
    pub metrics: Arc<SidecarMetrics>,
    /// The addresses that are this pod: a prefiller naming one of them is
    /// the decode engine itself.
    pub local: Vec<SocketAddr>,
}

pub async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Boxed>, Infallible> {
    let arrived = Instant::now();
    let route =
        if request.method() == Method::POST { Route::of(request.uri().path(), shared.config.engine) } else { None };
    Ok(match route {
        Some(route) => Split::new(shared, arrived).run(request, route).await,
        None => passthrough(&shared, request, arrived).await,
    })
}

/// Any other request: to the decode engine, body streamed both ways.
async fn passthrough(shared: &Arc<Shared>, request: Request<Incoming>, arrived: Instant) -> Response<Boxed> {
    shared.metrics.passthrough();
    let (parts, body) = request.into_parts();
    let mut headers = parts.headers;
    strip_for_engine(&mut headers);
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    match shared.decode_engine.send(parts.method, path, &headers, body.boxed()).await {
        Ok(answer) => stream_back(shared, answer, arrived, None, &[]),
        Err(error) => {
            shared.metrics.decode_unreachable();
            tracing::warn!(%error, decode = %shared.config.decode, path, "decode engine unreachable");
            openai_error(StatusCode::BAD_GATEWAY, "kvpick_sidecar_error", "the local engine is unreachable")
        }
    }
}

/// The engine's answer, streamed back with the hand-off headers.
fn stream_back(
    shared: &Arc<Shared>,
    answer: Response<Boxed>,
    arrived: Instant,
    decode_sent: Option<Instant>,
    extra: &[(&'static str, HeaderValue)],
) -> Response<Boxed> {
    let (mut parts, body) = answer.into_parts();
    strip_from_engine(&mut parts.headers);
    for (name, value) in extra {
        parts.headers.insert(HeaderName::from_static(name), value.clone());
    }
    let body = Answer::new(body, shared.metrics.clone(), arrived, decode_sent);
    Response::from_parts(parts, Boxed::new(body))
}

/// A request on a P/D route. Counts a cancel if dropped before it has an
/// answer (the client went away during the prefill leg).
struct Split {
    shared: Arc<Shared>,
    arrived: Instant,
    answered: bool,
}

impl Drop for Split {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.metrics.cancelled(Stage::Prefill);
        }
    }
}

/// The request as the legs need it.
struct Parsed {
    route: Route,
    path: String,
    headers: HeaderMap,
    body: Body,
}

impl Split {
    fn new(shared: Arc<Shared>, arrived: Instant) -> Self {
        Split { shared, arrived, answered: false }
    }

    async fn run(mut self, request: Request<Incoming>, route: Route) -> Response<Boxed> {
        let response = self.answer(request, route).await;
        self.answered = true;
        response
    }

    async fn answer(&self, request: Request<Incoming>, route: Route) -> Response<Boxed> {
        let config = &self.shared.config;
        let (parts, body) = request.into_parts();
        let prefiller = Prefiller::read(&parts.headers, &config.prefill_allow, &self.shared.local);
        let mut headers = parts.headers;
        strip_for_engine(&mut headers);
        let id = request_id(&headers);
        headers.insert(REQUEST_ID, id.clone());
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let bytes = match Limited::new(body, config.max_request_bytes).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                return if error.is::<http_body_util::LengthLimitError>() {
                    self.shared.metrics.ran(Mode::Failed);
                    openai_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "invalid_request_error",
                        &format!("the request body is larger than {} bytes", config.max_request_bytes),
                    )
                } else {
                    // The client's body broke off: nobody is left to answer.
                    tracing::debug!(%error, "request body broke off");
                    self.shared.metrics.ran(Mode::Failed);
                    openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", "the request body broke off")
                };
            }
        };
        let (bytes, body) = match own_fields_removed(bytes) {
            Ok(cleaned) => cleaned,
            Err(why) => {
                tracing::warn!(request_id = ?id, why, "request body refused");
                self.shared.metrics.ran(Mode::Failed);
                return openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", why);
            }
        };
        let target = match prefiller {
            Prefiller::At(target) => target,
            Prefiller::Absent => return self.whole(&path, headers, bytes, Aggregated::NoPrefiller).await,
            Prefiller::Local => return self.whole(&path, headers, bytes, Aggregated::PrefillerIsLocal).await,
            Prefiller::Invalid(why) => {
                tracing::warn!(request_id = ?id, why, "x-prefiller-host-port refused; running the request whole");
                return self.whole(&path, headers, bytes, Aggregated::InvalidPrefiller).await;
            }
            Prefiller::Denied(endpoint) => {
                tracing::warn!(request_id = ?id, %endpoint, "x-prefiller-host-port outside the allowlist; running the request whole");
                return self.whole(&path, headers, bytes, Aggregated::DeniedPrefiller).await;
            }
        };
        let body = match body {
            Some(body) => body,
            None => match Body::parse(&bytes) {
                Ok(body) => body,
                Err(_) => return self.whole(&path, headers, bytes, Aggregated::BodyNotJson).await,
            },
        };
        let parsed = Parsed { route, path, headers, body };
        match config.engine {
            EngineKind::Vllm => self.vllm(parsed, target).await,
            EngineKind::Sglang => self.sglang(parsed, target).await,
            EngineKind::Trtllm => self.trtllm(parsed, target).await,
        }
    }

    /// The request run whole on the local engine.
    async fn whole(&self, path: &str, headers: HeaderMap, bytes: Bytes, why: Aggregated) -> Response<Boxed> {
        self.shared.metrics.aggregated(why);
        let reason = HeaderValue::from_static(why.label());
        self.decode(
            Mode::Aggregated,
            path,
            headers,
            bytes,
            &[(PD_HANDOFF, HeaderValue::from_static("aggregated")), (PD_REASON, reason)],
        )
        .await
    }

    /// The decode leg (or a whole run) on the local engine, streamed back.
    async fn decode(
        &self,
        mode: Mode,
        path: &str,
        mut headers: HeaderMap,
        bytes: Bytes,
        extra: &[(&'static str, HeaderValue)],
    ) -> Response<Boxed> {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let sent = Instant::now();
        match self.shared.decode_engine.send(Method::POST, path, &headers, full(bytes)).await {
            Ok(answer) if mode == Mode::Disaggregated && !answer.status().is_success() => {
                // The prefill handed over but the decode engine refused
                // (a KV pull that failed, say): its error is the answer.
                self.decode_refused(answer, sent)
            }
            Ok(answer) => {
                self.shared.metrics.ran(mode);
                stream_back(&self.shared, answer, self.arrived, Some(sent), extra)
            }
            Err(error) => self.decode_unreachable(error),
        }
    }

    /// A decode leg's error answer after the prefill leg, passed on as the
    /// engine wrote it, marked failed for the EPP.
    fn decode_refused(&self, answer: Response<Boxed>, sent: Instant) -> Response<Boxed> {
        self.shared.metrics.ran(Mode::Failed);
        let status = answer.status();
        tracing::warn!(%status, decode = %self.shared.config.decode, "the decode engine refused a split request's decode leg");
        let extra =
            [(PD_HANDOFF, HeaderValue::from_static("failed")), (PD_REASON, HeaderValue::from_static("decode_status"))];
        stream_back(&self.shared, answer, self.arrived, Some(sent), &extra)
    }

    fn decode_unreachable(&self, error: String) -> Response<Boxed> {
        self.shared.metrics.decode_unreachable();
        self.shared.metrics.ran(Mode::Failed);
        tracing::warn!(%error, decode = %self.shared.config.decode, "decode engine unreachable");
        pd_failure(StatusCode::BAD_GATEWAY, "decode_unreachable", "the local decode engine is unreachable")
    }

    /// A failed prefill leg: the policy runs the request whole or fails it.
    async fn prefill_failed(&self, parsed: Parsed, target: SocketAddr, error: LegError) -> Response<Boxed> {
        self.shared.metrics.prefill_failed(error.why);
        let id = parsed.headers.get(REQUEST_ID).cloned();
        let reason = format!("prefill_{}", error.why.label());
        // SGLang's decode mode refuses a request without a bootstrap room:
        // there, a whole run cannot happen, and the prefill's failure is
        // the answer (rather than the engine's puzzling 400).
        let policy = match self.shared.config.engine {
            EngineKind::Sglang => OnPrefillFailure::Fail,
            _ => self.shared.config.on_prefill_failure,
        };
        match policy {
            OnPrefillFailure::Aggregate => {
                tracing::warn!(request_id = ?id, prefill = %target, reason, detail = error.detail, "prefill leg failed; running the request whole");
                self.shared.metrics.aggregated(Aggregated::PrefillFailed);
                let reason =
                    HeaderValue::from_str(&reason).unwrap_or_else(|_| HeaderValue::from_static("prefill_failed"));
                let bytes = Bytes::from(parsed.body.to_vec());
                let extra = [(PD_HANDOFF, HeaderValue::from_static("aggregated")), (PD_REASON, reason)];
                self.decode(Mode::Aggregated, &parsed.path, parsed.headers, bytes, &extra).await
            }
            OnPrefillFailure::Fail => {
                tracing::warn!(request_id = ?id, prefill = %target, reason, detail = error.detail, "prefill leg failed; answering an error");
                self.shared.metrics.ran(Mode::Failed);
                let status = if error.why == PrefillFailure::Timeout {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                // The details (the engine's address and answer) stay in the
                // log: the client may be anyone who reaches the pod.
                let message = format!("the prefill leg failed ({})", error.why.label());
                pd_failure(status, error.why.label(), &message)
            }
        }
    }

    /// The headers of a split request's answer.
    fn handed_off(&self, prefill_started: Instant) -> [(&'static str, HeaderValue); 2] {
        let elapsed = prefill_started.elapsed();
        self.shared.metrics.prefill_leg(elapsed);
        let ms = format!("{:.3}", elapsed.as_secs_f64() * 1e3);
        [
            (PD_HANDOFF, HeaderValue::from_static("disaggregated")),
            (PREFILL_MS, HeaderValue::from_str(&ms).unwrap_or_else(|_| HeaderValue::from_static("0"))),
        ]
    }

    /// The prefill leg of vLLM and TensorRT-LLM: one whole JSON answer.
    async fn prefill_json(&self, parsed: &Parsed, target: SocketAddr, body: Body) -> Result<Value, LegError> {
        let config = &self.shared.config;
        let bytes = body.to_vec();
        let answer = self
            .shared
            .engines
            .whole(
                target,
                &parsed.path,
                &parsed.headers,
                bytes,
                config.max_prefill_answer_bytes,
                config.prefill_timeout,
            )
            .await?;
        serde_json::from_slice(&answer).map_err(|e| {
            LegError::new(PrefillFailure::Answer, format!("the prefill engine {target}'s answer is not JSON: {e}"))
        })
    }

    async fn vllm(&self, parsed: Parsed, target: SocketAddr) -> Response<Boxed> {
        let started = Instant::now();
        let prefill = vllm::prefill_body(&parsed.body, parsed.route);
        let params = match self.prefill_json(&parsed, target, prefill).await {
            Ok(answer) => vllm::transfer_params(&answer).map_err(|e| unusable(target, e)),
            Err(e) => Err(e),
        };
        match params {
            Ok(params) => {
                let extra = self.handed_off(started);
                let body = vllm::decode_body(&parsed.body, params);
                let bytes = Bytes::from(body.to_vec());
                self.decode(Mode::Disaggregated, &parsed.path, parsed.headers, bytes, &extra).await
            }
            Err(error) => self.prefill_failed(parsed, target, error).await,
        }
    }

    async fn trtllm(&self, parsed: Parsed, target: SocketAddr) -> Response<Boxed> {
        let started = Instant::now();
        let context = trtllm::context_body(&parsed.body, self.shared.config.trtllm_context_max_tokens_1);
        let answer = match self.prefill_json(&parsed, target, context).await {
            Ok(answer) => answer,
            Err(error) => return self.prefill_failed(parsed, target, error).await,
        };
        match trtllm::after_context(&answer) {
            Ok(trtllm::AfterContext::Generate(params)) => {
                let extra = self.handed_off(started);
                let body = trtllm::generation_body(&parsed.body, params);
                let bytes = Bytes::from(body.to_vec());
                self.decode(Mode::Disaggregated, &parsed.path, parsed.headers, bytes, &extra).await
            }
            Ok(trtllm::AfterContext::Finished) => {
                // The first token ended the answer: it is the answer.
                let extra = self.handed_off(started);
                self.shared.metrics.ran(Mode::Disaggregated);
                let (bytes, content_type) = if streamed(&parsed.body) {
                    let usage =
                        parsed.body.get("stream_options").and_then(|o| o.get("include_usage").and_then(Value::as_bool));
                    (trtllm::as_event_stream(&answer, parsed.route, usage.unwrap_or(false)), "text/event-stream")
                } else {
                    (serde_json::to_vec(&answer).unwrap_or_default(), "application/json")
                };
                let mut response = Response::new(Boxed::new(Answer::new(
                    full(bytes),
                    self.shared.metrics.clone(),
                    self.arrived,
                    None,
                )));
                response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
                for (name, value) in extra {
                    response.headers_mut().insert(HeaderName::from_static(name), value);
                }
                response
            }
            Err(e) => self.prefill_failed(parsed, target, unusable(target, e)).await,
        }
    }

    /// SGLang: both legs at once. The answer goes back once the prefill
    /// leg is over (the decode engine cannot send a token before the KV
    /// is there anyway), so its headers are the hand-off.
    async fn sglang(&self, parsed: Parsed, target: SocketAddr) -> Response<Boxed> {
        let config = &self.shared.config;
        let started = Instant::now();
        let body = sglang::with_bootstrap(&parsed.body, parsed.route, target.ip(), config.bootstrap_port);
        let bytes = body.to_vec();
        let mut headers = parsed.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let engines = &self.shared.engines;
        let decode_sent = Instant::now();
        // Both legs live in this block: leaving it drops (aborts) whatever
        // is still running.
        let (prefilled, answer) = {
            let prefill = engines.whole(
                target,
                &parsed.path,
                &headers,
                bytes.clone(),
                config.max_prefill_answer_bytes,
                config.prefill_timeout,
            );
            let decode = self.shared.decode_engine.send(Method::POST, &parsed.path, &headers, full(bytes));
            tokio::pin!(prefill, decode);
            let (mut prefilled, mut answer) = (None, None);
            while prefilled.is_none() || answer.is_none() {
                tokio::select! {
                    done = &mut prefill, if prefilled.is_none() => {
                        let failed = done.is_err();
                        prefilled = Some(done);
                        if failed { break; }
                    }
                    done = &mut decode, if answer.is_none() => {
                        // Unreachable, or refused (a 400, a 503): the prefill
                        // cannot pair with it, so waiting for it is pointless.
                        let over = done.as_ref().map_or(true, |a| !a.status().is_success());
                        answer = Some(done);
                        if over { break; }
                    }
                }
            }
            (prefilled, answer)
        };
        match (prefilled, answer) {
            (_, Some(Err(error))) => self.decode_unreachable(error),
            (_, Some(Ok(answer))) if !answer.status().is_success() => self.decode_refused(answer, decode_sent),
            (Some(Err(error)), _) => {
                // Dropping the decode leg (sent or answering) aborts it.
                self.prefill_failed(parsed, target, error).await
            }
            (Some(Ok(_)), Some(Ok(answer))) => {
                let extra = self.handed_off(started);
                self.shared.metrics.ran(Mode::Disaggregated);
                stream_back(&self.shared, answer, self.arrived, Some(decode_sent), &extra)
            }
            // The loop ends only with both or with a failure.
            _ => pd_failure(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the legs ended out of order"),
        }
    }
}

fn unusable(target: SocketAddr, e: Unusable) -> LegError {
    LegError::new(PrefillFailure::Unusable, format!("the prefill engine {target}: {e}"))
}

/// A body as it goes on, and its parsed form when it was parsed.
pub type Cleaned = (Bytes, Option<Body>);

/// The protocols' own body fields: the sidecar's to set. A client's copy
/// could point an engine at any address (a decode engine pulls KV from
/// wherever `kv_transfer_params` says), so it never reaches one.
pub const OWN_FIELDS: [&str; 5] =
    ["kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room", "disaggregated_params"];

/// The body without [`OWN_FIELDS`], and its parsed form when it had to be
/// parsed for that. Most bodies name none of them: those are passed on
/// as they came, unparsed (a whole run never needs the JSON). A body that
/// may name one but cannot be read is refused (why): the engines' JSON
/// readers accept more than serde_json (UTF-16, `NaN`), so passing it on
/// unread could let a client's own fields through.
pub fn own_fields_removed(bytes: Bytes) -> Result<Cleaned, &'static str> {
    if std::str::from_utf8(&bytes).is_err() {
        return Err("the request body is not UTF-8 JSON");
    }
    let mentions = |field: &str| memchr::memmem::find(&bytes, field.as_bytes()).is_some();
    // A key may also be spelled with `\u` escapes, which the engines'
    // JSON decoders read as the same name: such a body is always parsed.
    if !["kv_transfer_params", "bootstrap_", "disaggregated_params", "\\u"].iter().any(|f| mentions(f)) {
        return Ok((bytes, None));
    }
    // Not a JSON object the sidecar reads (no engine takes anything else).
    let Ok(mut body) = Body::parse(&bytes) else {
        return Err("the request body names P/D fields and is not a JSON object the sidecar can read");
    };
    let removed = OWN_FIELDS.iter().filter(|f| body.remove(f)).count();
    if removed == 0 {
        return Ok((bytes, Some(body)));
    }
    tracing::debug!(removed, "the client's own P/D fields removed from its body");
    Ok((Bytes::from(body.to_vec()), Some(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_own_protocol_fields_are_removed_and_other_bodies_untouched() {
        let plain = Bytes::from_static(br#"{"model":"m",  "prompt":"bootstrap is a word"}"#);
        let clean = |b: Bytes| own_fields_removed(b).unwrap_or_else(|e| panic!("{e}"));
        let (bytes, body) = clean(plain.clone());
        assert_eq!(bytes, plain);
        assert!(body.is_none(), "not even parsed");
        let lying =
            Bytes::from_static(br#"{"model":"m","kv_transfer_params":{"remote_host":"10.9.9.9"},"bootstrap_room":1}"#);
        let (bytes, body) = clean(lying);
        assert_eq!(serde_json::from_slice::<Value>(&bytes).ok(), Some(serde_json::json!({"model": "m"})));
        assert_eq!(body.map(|b| b.to_value()), Some(serde_json::json!({"model": "m"})));
        // The same key with an escape is the same key to every JSON reader.
        let escaped = Bytes::from_static(br#"{"model":"m","kv_transfer\u005fparams":{"remote_host":"10.9.9.9"}}"#);
        let (bytes, _) = clean(escaped);
        assert_eq!(serde_json::from_slice::<Value>(&bytes).ok(), Some(serde_json::json!({"model": "m"})));
        // Naming one and unreadable (Python reads `NaN`; serde_json does
        // not), or not UTF-8 at all (Python reads UTF-16): refused.
        for refused in [&br#"{"kv_transfer_params":{},"temperature":NaN}"#[..], b"{\xff}", b"{kv_transfer_params"] {
            assert!(own_fields_removed(Bytes::from_static(refused)).is_err());
        }
        let not_json = Bytes::from_static(b"{model");
        assert_eq!(clean(not_json.clone()).0, not_json, "passed on: the engine answers it");
    }
}
