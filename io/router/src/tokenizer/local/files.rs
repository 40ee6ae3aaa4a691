//! A model directory as the engines read it: `tokenizer.json` (the Hugging
//! Face tokenizer), `tokenizer_config.json` (special tokens, the chat
//! template) and, where transformers saved it separately,
//! `chat_template.jinja` or `chat_template.json`.
//!
//! Where the chat template comes from, first found wins (transformers'
//! order): an explicit template file (the engine's `--chat-template`),
//! `chat_template.jinja`, `tokenizer_config.json`'s `chat_template` (one
//! string, or a list of named templates), `chat_template.json`. A model
//! without one can still tokenize completions; chat bodies are then
//! unsupported (vLLM refuses them too).
//!
//! Every file is size-capped before it is read, and every error names the
//! file and what is wrong with it.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value as Json;

/// Largest `tokenizer.json` read (the largest public ones, with 256k-token
/// vocabularies, are about 35 MB).
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 256 << 20;
/// Largest `tokenizer_config.json`, chat template or `chat_template.json`.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Loading failed: the path and why.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct LoadError {
    pub path: PathBuf,
    pub reason: String,
}

impl LoadError {
    pub(super) fn new(path: &Path, reason: impl Into<String>) -> LoadError {
        LoadError { path: path.to_path_buf(), reason: reason.into() }
    }
}

/// The chat templates of a model: one, or several by name (`default`,
/// `tool_use`, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Templates {
    None,
    One(String),
    Named(Vec<(String, String)>),
}

/// What `tokenizer_config.json` says that matters here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token`, `eos_token`, `unk_token`, `pad_token`, `sep_token`,
    /// `cls_token`, `mask_token`: the ones set, as strings (transformers
    /// passes its `special_tokens_map` to the template).
    pub named: Vec<(&'static str, String)>,
    /// `additional_special_tokens`, when listed.
    pub additional: Vec<String>,
}

/// A model directory's contents, parsed (the tokenizer itself is built by
/// the caller from `tokenizer_json`).
#[derive(Debug)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub tokenizer_json: Vec<u8>,
    pub templates: Templates,
    /// Where the templates came from, for the log line.
    pub template_source: Option<PathBuf>,
    pub special: SpecialTokens,
}

const SPECIAL_NAMES: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"];

impl ModelFiles {
    /// Reads `dir`; `template_override` is a Jinja file that replaces the
    /// model's own chat template.
    pub fn load(dir: &Path, template_override: Option<&Path>) -> Result<ModelFiles, LoadError> {
        if !dir.is_dir() {
            return Err(LoadError::new(dir, "not a directory (expected a model directory with tokenizer.json)"));
        }
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer_json = read_capped(&tokenizer_path, MAX_TOKENIZER_JSON_BYTES)?;
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = if config_path.exists() {
            parse_json(&config_path, &read_capped(&config_path, MAX_CONFIG_BYTES)?)?
        } else {
            Json::Object(Default::default())
        };
        let special = special_tokens(&config_path, &config)?;

        let (templates, template_source) = if let Some(path) = template_override {
            (Templates::One(read_text(path)?), Some(path.to_path_buf()))
        } else if dir.join("chat_template.jinja").exists() {
            let path = dir.join("chat_template.jinja");
            (Templates::One(read_text(&path)?), Some(path))
        } else if let Some(found) = templates_in(&config_path, &config)? {
            (found, Some(config_path.clone()))
        } else if dir.join("chat_template.json").exists() {
            let path = dir.join("chat_template.json");
            let json = parse_json(&path, &read_capped(&path, MAX_CONFIG_BYTES)?)?;
            match templates_in(&path, &json)? {
                Some(found) => (found, Some(path)),
                None => return Err(LoadError::new(&path, "has no `chat_template`")),
            }
        } else {
            (Templates::None, None)
        };
        Ok(ModelFiles { dir: dir.to_path_buf(), tokenizer_json, templates, template_source, special })
    }
}

/// Parses what [`ModelFiles::load`] reads from `tokenizer_config.json`
/// (public for the fuzz target: everything from the bytes on).
pub fn parse_tokenizer_config(bytes: &[u8]) -> Result<(Templates, SpecialTokens), LoadError> {
    let path = Path::new("tokenizer_config.json");
    let config = parse_json(path, bytes)?;
    let templates = templates_in(path, &config)?.unwrap_or(Templates::None);
    Ok((templates, special_tokens(path, &config)?))
}

fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, LoadError> {
    let file = fs::File::open(path).map_err(|e| LoadError::new(path, format!("cannot open: {e}")))?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(|e| LoadError::new(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(LoadError::new(path, format!("larger than {max} bytes")));
    }
    Ok(bytes)
}

fn read_text(path: &Path) -> Result<String, LoadError> {
    String::from_utf8(read_capped(path, MAX_CONFIG_BYTES)?).map_err(|_| LoadError::new(path, "not UTF-8 text"))
}

/// A JSON object (the config files are objects; anything else is refused).
fn parse_json(path: &Path, bytes: &[u8]) -> Result<Json, LoadError> {
    match serde_json::from_slice(bytes) {
        Ok(object @ Json::Object(_)) => Ok(object),
        Ok(_) => Err(LoadError::new(path, "not a JSON object")),
        Err(e) => Err(LoadError::new(path, format!("not valid JSON: {e}"))),
    }
}

/// A special token is a string or an `AddedToken` object (`{"content": …}`).
fn token_text(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}

fn special_tokens(path: &Path, config: &Json) -> Result<SpecialTokens, LoadError> {
    let mut special = SpecialTokens::default();
    for name in SPECIAL_NAMES {
        match config.get(name) {
            None | Some(Json::Null) => {}
            Some(value) => match token_text(value) {
                Some(text) => special.named.push((name, text)),
                None => return Err(LoadError::new(path, format!("`{name}` is neither a string nor a token object"))),
            },
        }
    }
    if let Some(Json::Array(list)) = config.get("additional_special_tokens") {
        special.additional = list.iter().filter_map(token_text).collect();
    }
    Ok(special)
}

#[derive(Deserialize)]
struct Named {
    name: String,
    template: String,
}

fn templates_in(path: &Path, config: &Json) -> Result<Option<Templates>, LoadError> {
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(one)) => Ok(Some(Templates::One(one.clone()))),
        Some(list @ Json::Array(_)) => {
            let named: Vec<Named> = serde_json::from_value(list.clone()).map_err(|e| {
                LoadError::new(path, format!("`chat_template` is a list but not of {{name, template}}: {e}"))
            })?;
            if named.is_empty() {
                return Ok(None);
            }
            Ok(Some(Templates::Named(named.into_iter().map(|n| (n.name, n.template)).collect())))
        }
        Some(_) => Err(LoadError::new(path, "`chat_template` is neither a string nor a list of named templates")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_forms() {
        let (templates, special) = parse_tokenizer_config(
            br#"{"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>", "pad_token": null,
                 "additional_special_tokens": ["<a>", {"content": "<b>"}],
                 "chat_template": [{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(templates, Templates::Named(vec![("default".into(), "d".into()), ("tool_use".into(), "t".into())]));
        assert_eq!(special.named, vec![("bos_token", "<s>".into()), ("eos_token", "</s>".into())]);
        assert_eq!(special.additional, ["<a>", "<b>"]);
        let (templates, _) = parse_tokenizer_config(br#"{"chat_template": "x"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(templates, Templates::One("x".into()));
        for bad in [
            &b"[1]"[..],
            br#"{"chat_template": 3}"#,
            br#"{"chat_template": [{"name": 1}]}"#,
            br#"{"bos_token": 5}"#,
            b"{",
        ] {
            assert!(parse_tokenizer_config(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
