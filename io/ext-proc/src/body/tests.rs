use super::*;

fn parse(body: &str, api: Option<Api>) -> Result<RequestBody, RequestError> {
    RequestBody::parse(body.as_bytes(), api)
}

#[test]
fn chat_body() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi \"there\""}],"stream":true,"cache_salt":"s","priority":3}"#;
    let parsed = parse(body, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.model, "m");
    assert_eq!(parsed.api, Some(Api::ChatCompletions));
    assert!(parsed.stream);
    assert_eq!(parsed.cache_salt.as_deref(), Some("s"));
    assert_eq!(parsed.priority, -3);
    assert_eq!(parsed.prompt, None);
}

#[test]
fn completion_prompt_string_and_array() {
    let parsed = parse(r#"{"model":"m","prompt":"once upon"}"#, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((parsed.api, parsed.prompt.as_deref()), (Some(Api::Completions), Some("once upon")));
    let parsed = parse(r#"{"model":"m","prompt":[1,2,3]}"#, Some(Api::Completions)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((parsed.api, parsed.prompt), (Some(Api::Completions), None));
}

#[test]
fn escaped_model_name() {
    let parsed = parse(r#"{"model":"org\/m\u00e9"}"#, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.model, "org/mé");
    assert_eq!(parsed.api, None);
}

#[test]
fn errors() {
    assert!(matches!(parse(r#"{"model":"m","messages":[{"#, None), Err(RequestError::InvalidJson(_))));
    assert!(matches!(parse("[1,2]", None), Err(RequestError::InvalidJson(_))));
    assert!(matches!(parse("", None), Err(RequestError::InvalidJson(_))));
    assert_eq!(parse(r#"{"messages":[]}"#, None), Err(RequestError::MissingModel));
    assert_eq!(parse(r#"{"model":null}"#, None), Err(RequestError::MissingModel));
    assert_eq!(parse(r#"{"model":" "}"#, None), Err(RequestError::MissingModel));
    assert!(matches!(parse(r#"{"model":7}"#, None), Err(RequestError::InvalidJson(_))));
}

#[test]
fn priority_saturates() {
    let parsed = parse(r#"{"model":"m","priority":-9223372036854775808}"#, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.priority, i32::MAX);
    let parsed = parse(r#"{"model":"m","priority":9999999999}"#, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.priority, i32::MIN);
}

#[test]
fn paths() {
    assert_eq!(api_of_path("/v1/chat/completions"), Some(Api::ChatCompletions));
    assert_eq!(api_of_path("/v1/completions/"), Some(Api::Completions));
    assert_eq!(api_of_path("/v1/embeddings"), None);
}

#[test]
fn a_session_id_is_a_short_string_or_nothing() {
    let session = |json: &str| parse(json, None).unwrap_or_else(|e| panic!("{e}")).session_id;
    assert_eq!(session(r#"{"model":"m","session_id":" chat-7 "}"#).as_deref(), Some("chat-7"));
    // Not a string, empty or too long: ignored, never a refused request.
    assert_eq!(session(r#"{"model":"m","session_id":42}"#), None);
    assert_eq!(session(r#"{"model":"m","session_id":{"a":[1]}}"#), None);
    assert_eq!(session(r#"{"model":"m","session_id":""}"#), None);
    let long = format!(r#"{{"model":"m","session_id":"{}"}}"#, "x".repeat(crate::headers::MAX_SESSION_KEY_BYTES + 1));
    assert_eq!(session(&long), None);
    assert_eq!(session(r#"{"model":"m"}"#), None);
}
