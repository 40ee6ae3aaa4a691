//! ghz data files: a JSON array of `envoy.service.ext_proc.v3.ProcessingRequest`
//! messages in the protobuf JSON mapping (one stream's messages, in order;
//! ghz sends them as one bidi call). Decoded here into the prost types so
//! `kvpick-load --data FILE` sends exactly what `ghz -D FILE` would.
//!
//! The mapping's rules that matter here: fields may be spelled as in the
//! .proto (`request_headers`) or in lowerCamelCase (`requestHeaders`);
//! `bytes` fields are base64 (standard or URL-safe, padding optional);
//! enums are their name or number; `google.protobuf.Struct` is a plain
//! JSON object. Unknown fields are refused, as protobuf JSON parsers do by
//! default, so a typo cannot silently drop a header.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use kvpick_proto::core::{HeaderMap, HeaderValue, Metadata};
use kvpick_proto::ext_proc::mode::BodySendMode;
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::{HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProtocolConfiguration};
use kvpick_proto::protobuf::{Kind, ListValue, Struct, Value};
use serde_json::{Map, Value as Json};

use crate::script::{Script, is_response_path};

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read the data file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("the data file {path} is not JSON: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{at}: {problem}")]
    Field { at: String, problem: String },
}

fn problem(at: &str, problem: impl Into<String>) -> DataError {
    DataError::Field { at: at.to_string(), problem: problem.into() }
}

/// Reads a ghz data file into one stream's script.
pub fn read(path: &Path) -> Result<Script, DataError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Read { path: name.clone(), source })?;
    let json: Json = serde_json::from_str(&text).map_err(|source| DataError::Json { path: name, source })?;
    script(&json)
}

/// A data file's JSON (an array of messages) as a script.
pub fn script(json: &Json) -> Result<Script, DataError> {
    let Json::Array(items) = json else {
        return Err(problem(
            "data",
            "must be a JSON array of ProcessingRequest messages (ghz sends a single object as every \
             message of a streaming call, which is no gateway's stream)",
        ));
    };
    if items.is_empty() {
        return Err(problem("data", "the array is empty"));
    }
    let mut request = Vec::new();
    let mut response = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("data[{i}]");
        let message = processing_request(item, &at)?;
        if message.protocol_config.is_some() && i != 0 {
            return Err(problem(&at, "protocol_config is only read from a stream's first message"));
        }
        if is_response_path(&message) {
            response.push(message);
        } else if response.is_empty() {
            request.push(message);
        } else {
            return Err(problem(&at, "a request-path message after the response began"));
        }
    }
    if request.is_empty() {
        return Err(problem("data", "no request-path message: a gateway's stream starts with request_headers"));
    }
    Ok(Script::new(request, response))
}

/// Field names as the .proto spells them: protobuf JSON also accepts
/// lowerCamelCase.
fn snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn object<'a>(json: &'a Json, at: &str) -> Result<&'a Map<String, Json>, DataError> {
    json.as_object().ok_or_else(|| problem(at, "expected a JSON object"))
}

fn boolean(json: &Json, at: &str) -> Result<bool, DataError> {
    json.as_bool().ok_or_else(|| problem(at, "expected true or false"))
}

fn string(json: &Json, at: &str) -> Result<String, DataError> {
    json.as_str().map(str::to_owned).ok_or_else(|| problem(at, "expected a string"))
}

const STANDARD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const URL_SAFE: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A `bytes` field: base64, either alphabet.
fn bytes(json: &Json, at: &str) -> Result<Vec<u8>, DataError> {
    let text = json.as_str().ok_or_else(|| problem(at, "expected a base64 string (a bytes field)"))?;
    STANDARD.decode(text).or_else(|_| URL_SAFE.decode(text)).map_err(|e| problem(at, format!("not base64: {e}")))
}

fn unknown(at: &str, key: &str, known: &str) -> DataError {
    problem(&format!("{at}.{key}"), format!("unknown field (known here: {known})"))
}

fn processing_request(json: &Json, at: &str) -> Result<ProcessingRequest, DataError> {
    let mut out = ProcessingRequest::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        let request = match snake(key).as_str() {
            "request_headers" => Request::RequestHeaders(http_headers(value, &here)?),
            "response_headers" => Request::ResponseHeaders(http_headers(value, &here)?),
            "request_body" => Request::RequestBody(http_body(value, &here)?),
            "response_body" => Request::ResponseBody(http_body(value, &here)?),
            "request_trailers" => Request::RequestTrailers(http_trailers(value, &here)?),
            "response_trailers" => Request::ResponseTrailers(http_trailers(value, &here)?),
            "metadata_context" => {
                out.metadata_context = Some(metadata(value, &here)?);
                continue;
            }
            "attributes" => {
                out.attributes = struct_map(value, &here)?;
                continue;
            }
            "observability_mode" => {
                out.observability_mode = boolean(value, &here)?;
                continue;
            }
            "protocol_config" => {
                out.protocol_config = Some(protocol_config(value, &here)?);
                continue;
            }
            _ => {
                return Err(unknown(
                    at,
                    key,
                    "request_headers, request_body, request_trailers, response_headers, response_body, \
                     response_trailers, metadata_context, attributes, observability_mode, protocol_config",
                ));
            }
        };
        if out.request.is_some() {
            return Err(problem(&here, "a ProcessingRequest carries one of request/response headers/body/trailers"));
        }
        out.request = Some(request);
    }
    Ok(out)
}

fn http_headers(json: &Json, at: &str) -> Result<HttpHeaders, DataError> {
    let mut out = HttpHeaders::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        match snake(key).as_str() {
            "headers" => out.headers = Some(header_map(value, &here)?),
            "end_of_stream" => out.end_of_stream = boolean(value, &here)?,
            _ => return Err(unknown(at, key, "headers, end_of_stream")),
        }
    }
    Ok(out)
}

fn header_map(json: &Json, at: &str) -> Result<HeaderMap, DataError> {
    let mut out = HeaderMap::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        match snake(key).as_str() {
            "headers" => {
                let list = value.as_array().ok_or_else(|| problem(&here, "expected an array of HeaderValue"))?;
                for (i, header) in list.iter().enumerate() {
                    out.headers.push(header_value(header, &format!("{here}[{i}]"))?);
                }
            }
            _ => return Err(unknown(at, key, "headers")),
        }
    }
    Ok(out)
}

fn header_value(json: &Json, at: &str) -> Result<HeaderValue, DataError> {
    let mut out = HeaderValue::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        match snake(key).as_str() {
            "key" => out.key = string(value, &here)?,
            "value" => out.value = string(value, &here)?,
            "raw_value" => out.raw_value = bytes(value, &here)?,
            _ => return Err(unknown(at, key, "key, value, raw_value")),
        }
    }
    if out.key.is_empty() {
        return Err(problem(at, "a header needs a key"));
    }
    Ok(out)
}

fn http_body(json: &Json, at: &str) -> Result<HttpBody, DataError> {
    let mut out = HttpBody::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        match snake(key).as_str() {
            "body" => out.body = bytes(value, &here)?,
            "end_of_stream" => out.end_of_stream = boolean(value, &here)?,
            _ => return Err(unknown(at, key, "body, end_of_stream")),
        }
    }
    Ok(out)
}

fn http_trailers(json: &Json, at: &str) -> Result<HttpTrailers, DataError> {
    let mut out = HttpTrailers::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        match snake(key).as_str() {
            "trailers" => out.trailers = Some(header_map(value, &here)?),
            _ => return Err(unknown(at, key, "trailers")),
        }
    }
    Ok(out)
}

fn metadata(json: &Json, at: &str) -> Result<Metadata, DataError> {
    let mut out = Metadata::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        match snake(key).as_str() {
            "filter_metadata" => out.filter_metadata = struct_map(value, &here)?,
            _ => return Err(unknown(at, key, "filter_metadata")),
        }
    }
    Ok(out)
}

fn struct_map(json: &Json, at: &str) -> Result<HashMap<String, Struct>, DataError> {
    let mut out = HashMap::new();
    for (key, value) in object(json, at)? {
        out.insert(key.clone(), to_struct(object(value, &format!("{at}.{key}"))?));
    }
    Ok(out)
}

fn to_struct(map: &Map<String, Json>) -> Struct {
    Struct { fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect() }
}

fn to_value(json: &Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue { values: items.iter().map(to_value).collect() }),
        Json::Object(map) => Kind::StructValue(to_struct(map)),
    };
    Value { kind: Some(kind) }
}

fn body_mode(json: &Json, at: &str) -> Result<i32, DataError> {
    let mode = match json {
        Json::String(name) => BodySendMode::from_str_name(name).map(|m| m as i32),
        Json::Number(n) => {
            n.as_i64().and_then(|n| i32::try_from(n).ok()).filter(|&n| BodySendMode::try_from(n).is_ok())
        }
        _ => None,
    };
    mode.ok_or_else(|| {
        problem(at, "expected a BodySendMode (NONE, STREAMED, BUFFERED, BUFFERED_PARTIAL, FULL_DUPLEX_STREAMED, GRPC)")
    })
}

fn protocol_config(json: &Json, at: &str) -> Result<ProtocolConfiguration, DataError> {
    let mut out = ProtocolConfiguration::default();
    for (key, value) in object(json, at)? {
        let here = format!("{at}.{key}");
        match snake(key).as_str() {
            "request_body_mode" => out.request_body_mode = body_mode(value, &here)?,
            "response_body_mode" => out.response_body_mode = body_mode(value, &here)?,
            "send_body_without_waiting_for_header_response" => {
                out.send_body_without_waiting_for_header_response = boolean(value, &here)?
            }
            _ => {
                return Err(unknown(
                    at,
                    key,
                    "request_body_mode, response_body_mode, send_body_without_waiting_for_header_response",
                ));
            }
        }
    }
    Ok(out)
}

/// A script as a ghz data file (proto field names, defaults left out).
/// Header values go in `raw_value` as Envoy sends them, except those
/// holding ghz's request-number template: ghz fills templates in the
/// file's text, which it cannot do inside base64.
pub fn to_json(script: &Script) -> Json {
    Json::Array(script.request.iter().chain(&script.response).map(message_json).collect())
}

fn message_json(message: &ProcessingRequest) -> Json {
    let mut out = Map::new();
    if let Some(config) = &message.protocol_config {
        let name = |mode: i32| BodySendMode::try_from(mode).map_or("NONE", |m| m.as_str_name());
        let mut c = Map::new();
        c.insert("request_body_mode".into(), Json::from(name(config.request_body_mode)));
        c.insert("response_body_mode".into(), Json::from(name(config.response_body_mode)));
        if config.send_body_without_waiting_for_header_response {
            c.insert("send_body_without_waiting_for_header_response".into(), Json::Bool(true));
        }
        out.insert("protocol_config".into(), Json::Object(c));
    }
    let (key, value) = match &message.request {
        Some(Request::RequestHeaders(h)) => ("request_headers", headers_json(h)),
        Some(Request::ResponseHeaders(h)) => ("response_headers", headers_json(h)),
        Some(Request::RequestBody(b)) => ("request_body", body_json(b)),
        Some(Request::ResponseBody(b)) => ("response_body", body_json(b)),
        Some(Request::RequestTrailers(t)) => ("request_trailers", trailers_json(t)),
        Some(Request::ResponseTrailers(t)) => ("response_trailers", trailers_json(t)),
        None => return Json::Object(out),
    };
    out.insert(key.into(), value);
    Json::Object(out)
}

fn header_map_json(map: Option<&HeaderMap>) -> Json {
    let headers: Vec<Json> = map
        .map(|m| m.headers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|h| {
            let mut o = Map::new();
            o.insert("key".into(), Json::from(h.key.as_str()));
            let raw = String::from_utf8_lossy(&h.raw_value);
            if h.value.contains(crate::script::REQUEST_NUMBER) || raw.contains(crate::script::REQUEST_NUMBER) {
                let text = if h.value.is_empty() { raw.into_owned() } else { h.value.clone() };
                o.insert("value".into(), Json::from(text));
            } else {
                if !h.value.is_empty() {
                    o.insert("value".into(), Json::from(h.value.as_str()));
                }
                if !h.raw_value.is_empty() {
                    o.insert(
                        "raw_value".into(),
                        Json::from(base64::engine::general_purpose::STANDARD.encode(&h.raw_value)),
                    );
                }
            }
            Json::Object(o)
        })
        .collect();
    serde_json::json!({ "headers": headers })
}

fn headers_json(h: &HttpHeaders) -> Json {
    let mut o = Map::new();
    o.insert("headers".into(), header_map_json(h.headers.as_ref()));
    if h.end_of_stream {
        o.insert("end_of_stream".into(), Json::Bool(true));
    }
    Json::Object(o)
}

fn body_json(b: &HttpBody) -> Json {
    let mut o = Map::new();
    o.insert("body".into(), Json::from(base64::engine::general_purpose::STANDARD.encode(&b.body)));
    if b.end_of_stream {
        o.insert("end_of_stream".into(), Json::Bool(true));
    }
    Json::Object(o)
}

fn trailers_json(t: &HttpTrailers) -> Json {
    serde_json::json!({ "trailers": header_map_json(t.trailers.as_ref()) })
}
