//! The model directory `kvpick demo` writes for every `--engine` but vLLM
//! (and for `--tokenizer generated`): a
//! Hugging Face word-level `tokenizer.json` and a ChatML chat template in
//! `tokenizer_config.json`, made for the demo's workload (its words `w0` to
//! `w4999` and the simulated model's reply words each one token).
//!
//! TensorRT-LLM has no render endpoint and SGLang's `/tokenize` renders no
//! chat, so kvpick tokenizes in-process (`--tokenizer local:DIR`); the
//! simulated engines tokenize with the same directory, as real engines
//! serving that model would.

use std::path::Path;

use kvpick_sim::tokenizer::OUTPUT_WORDS;
use serde_json::{Map, Value, json};

/// Distinct words the demo's prompts are made of.
pub const PROMPT_WORDS: u32 = 5000;

const SPECIALS: [&str; 3] = ["<unk>", "<|im_start|>", "<|im_end|>"];

const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Writes the two files into `dir` (which must exist).
pub fn write(dir: &Path) -> Result<(), String> {
    let mut vocab = Map::new();
    let words = SPECIALS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(["system", "user", "assistant"].map(str::to_owned))
        .chain((0..PROMPT_WORDS).map(|i| format!("w{i}")))
        .chain(OUTPUT_WORDS.iter().map(|w| (*w).to_owned()));
    for word in words {
        let id = vocab.len();
        vocab.entry(word).or_insert(json!(id));
    }
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    });
    let config = json!({
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    });
    for (name, value) in [("tokenizer.json", tokenizer), ("tokenizer_config.json", config)] {
        let path = dir.join(name);
        std::fs::write(&path, value.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
