//! The in-process tokenizer's inputs: the first byte picks what the rest is.
//!
//! - 0: a `tokenizer_config.json` (operator-supplied, but read at start
//!   from a mounted volume): parsed, its special tokens read and its chat
//!   templates compiled (not rendered: a template is trusted code).
//! - 1, 2: a chat body (client-supplied) rendered by the fixture models'
//!   templates (ChatML with tools, Llama-like with namespaces and `tojson`)
//!   and tokenized.
//! - 3: a completion body (string, list, token-id prompts) tokenized.
//!
//! Nothing may panic; a bad body is an error, never a crash.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kvpick_router::tokenizer::local::files::parse_tokenizer_config;
use kvpick_router::tokenizer::local::template::ChatTemplate;
use kvpick_router::tokenizer::{Api, LocalTokenizer, LocalTokenizerConfig, TokenizerMetrics};
use libfuzzer_sys::fuzz_target;

fn model(name: &str) -> LocalTokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer").join(name);
    let config = LocalTokenizerConfig { dir, chat_template: None };
    LocalTokenizer::load(&config, Arc::new(TokenizerMetrics::new())).expect("the fixture model loads")
}

fn models() -> &'static [LocalTokenizer; 2] {
    static MODELS: OnceLock<[LocalTokenizer; 2]> = OnceLock::new();
    MODELS.get_or_init(|| [model("chatml"), model("llama")])
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 4 {
        0 => {
            if let Ok((templates, special)) = parse_tokenizer_config(rest) {
                let _ = ChatTemplate::new(&templates, &special);
            }
        }
        1 | 2 => {
            let _ = models()[usize::from(mode % 4 - 1)].tokenize_body(Api::ChatCompletions, rest);
        }
        _ => {
            let _ = models()[0].tokenize_body(Api::Completions, rest);
        }
    }
});
