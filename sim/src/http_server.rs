//! The engine's HTTP surface (vLLM's, engines.md §2): routes, shared state,
//! OpenAI-style errors, `/health`, `/v1/models` and `/metrics`.
//!
//! Every answer of a generation or render endpoint carries the header
//! `x-sim-engine: <engine name>`, so a test behind a gateway can tell which
//! engine served it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvpick_router::tokenizer::{Api, LocalTokenizer};
use serde_json::{Value, json};

use super::completions;
use super::config::{EngineConfig, Flavour};
use super::engine::EngineClient;
use super::event_drain::EventDrain;
use super::metrics;
use super::pd::{self, PdCounters, TransferHub};
use super::render::{self, RenderFault};
use super::sglang_api;
use super::tokenizer::{render_chat, render_completion};

/// Response header naming the engine that answered.
pub const ENGINE_HEADER: &str = "x-sim-engine";

pub(crate) struct HttpState {
    pub(crate) engine: EngineClient,
    pub(crate) config: Arc<EngineConfig>,
    /// The model directory's tokenizer, when one was given.
    pub(crate) tokenizer: Option<LocalTokenizer>,
    /// TensorRT-LLM's event buffer, served at `/kv_cache_events`.
    drain: Option<Arc<EventDrain>>,
    requests: AtomicU64,
    /// Faults of the render endpoints.
    pub(crate) render_fault: RenderFault,
    /// A prefill engine's offers of held KV.
    pub(crate) hub: Arc<TransferHub>,
    pub(crate) pd: Arc<PdCounters>,
    /// A prefill engine's side channel (see `EngineEndpoints::bootstrap`).
    pub(crate) side_channel: Option<SocketAddr>,
    /// vLLM's `remote_engine_id` of this engine.
    pub(crate) engine_id: String,
    /// Next block number handed to an offer.
    pub(crate) next_block: AtomicU64,
}

/// The P/D state the engine shares with its HTTP server.
pub(crate) struct PdParts {
    pub(crate) hub: Arc<TransferHub>,
    pub(crate) pd: Arc<PdCounters>,
    pub(crate) bootstrap: Option<SocketAddr>,
}

impl HttpState {
    pub(crate) fn new(
        engine: EngineClient,
        config: Arc<EngineConfig>,
        tokenizer: Option<LocalTokenizer>,
        drain: Option<Arc<EventDrain>>,
        pd_parts: PdParts,
    ) -> Arc<Self> {
        let engine_id = pd::engine_uuid(&config.name, config.seed);
        Arc::new(HttpState {
            engine,
            config,
            tokenizer,
            drain,
            requests: AtomicU64::new(0),
            render_fault: RenderFault::default(),
            hub: pd_parts.hub,
            pd: pd_parts.pd,
            side_channel: pd_parts.bootstrap,
            engine_id,
            next_block: AtomicU64::new(0),
        })
    }

    /// A chat body's prompt tokens: the model directory's tokenizer when
    /// there is one, else the built-in one.
    pub(crate) fn chat_tokens(&self, bytes: &[u8], body: &serde_json::Value) -> Result<Vec<u32>, ApiError> {
        match &self.tokenizer {
            Some(t) => t.tokenize_body(Api::ChatCompletions, bytes).map_err(|e| ApiError::bad_request(e.to_string())),
            None => render_chat(body).map_err(|e| ApiError::bad_request(e.0)),
        }
    }

    /// A completion body's prompts' tokens (the model directory's tokenizer
    /// reads the first prompt only).
    pub(crate) fn completion_tokens(&self, bytes: &[u8], body: &serde_json::Value) -> Result<Vec<Vec<u32>>, ApiError> {
        match &self.tokenizer {
            Some(t) => t
                .tokenize_body(Api::Completions, bytes)
                .map(|ids| vec![ids])
                .map_err(|e| ApiError::bad_request(e.to_string())),
            None => render_completion(body).map_err(|e| ApiError::bad_request(e.0)),
        }
    }

    /// A request id: the client's `x-request-id`, else a per-engine counter.
    pub(crate) fn request_id(&self, prefix: &str, headers: &HeaderMap) -> String {
        match headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
            Some(id) if !id.is_empty() => format!("{prefix}-{id}"),
            _ => format!("{prefix}-{}-{}", self.config.name, self.requests.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The `x-sim-engine` header.
    pub(crate) fn engine_header(&self) -> (HeaderName, HeaderValue) {
        let value = HeaderValue::from_str(&self.config.name).unwrap_or_else(|_| HeaderValue::from_static("engine"));
        (HeaderName::from_static(ENGINE_HEADER), value)
    }
}

/// vLLM's routes; `trtllm-serve`'s have no render endpoints and add the
/// KV-event drain; SGLang's add `/tokenize` and `/generate`.
pub(crate) fn router(state: Arc<HttpState>) -> Router {
    let routes = Router::new()
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text));
    let routes = match state.config.flavour {
        Flavour::Vllm => routes
            .route("/v1/chat/completions/render", post(render::chat))
            .route("/v1/completions/render", post(render::completions))
            .route("/inference/v1/generate", post(completions::tokens_generate)),
        Flavour::Trtllm => routes.route("/kv_cache_events", post(kv_cache_events)),
        Flavour::Sglang => {
            routes.route("/tokenize", post(sglang_api::tokenize)).route("/generate", post(sglang_api::generate))
        }
    };
    routes.with_state(state)
}

/// `trtllm-serve`'s destructive drain: every buffered event, as JSON.
async fn kv_cache_events(State(state): State<Arc<HttpState>>) -> Response {
    let body = state.drain.as_ref().map_or_else(|| "[]".to_owned(), |d| d.drain());
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An error answer in vLLM's shape: `{"error": {message, type, param, code}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into() }
    }

    pub(crate) fn body(&self) -> Value {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        json!({"error": {"message": self.message, "type": kind, "param": null, "code": self.status.as_u16()}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Parses a JSON object body and checks its `model`, if any, is served.
pub(crate) fn parse_body(state: &HttpState, bytes: &[u8]) -> Result<Value, ApiError> {
    let body: Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    match body.get("model") {
        None | Some(Value::Null) => Ok(body),
        Some(Value::String(model)) if *model == state.config.model => Ok(body),
        Some(other) => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{}` does not exist.", other.as_str().unwrap_or(&other.to_string())),
        }),
    }
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn models(State(state): State<Arc<HttpState>>) -> axum::Json<Value> {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model,
            "object": "model",
            "owned_by": "kvpick-sim",
            "root": state.config.model,
            "max_model_len": state.config.max_model_len,
        }],
    }))
}

async fn metrics_text(State(state): State<Arc<HttpState>>) -> Response {
    match state.engine.stats().await {
        Ok(stats) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            metrics::render(&state.config, &stats, &state.pd),
        )
            .into_response(),
        Err(error) => ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: error.to_string() }.into_response(),
    }
}
