//! A model directory for the tokenizer benchmarks, built here (no model is
//! downloaded): a byte-level BPE `tokenizer.json` trained on a synthetic
//! corpus to a production-sized vocabulary (GPT-2's pre-tokenizer regex,
//! 32,000 entries by default: Llama 2 and Mistral 7B use 32,000), and a
//! ChatML chat template in `tokenizer_config.json`.
//!
//! The corpus: Zipf-distributed words of 2–4 random syllables (about
//! 60,000 distinct ones), punctuation and newlines; prompts are drawn the
//! same way.
//! Everything is seeded: the same vocabulary every run.

use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, TokenizerImpl};

/// ChatML, as Qwen2 and many fine-tunes ship it.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const SYLLABLES: [&str; 48] = [
    "ka", "to", "ri", "mon", "el", "sa", "ve", "lu", "pra", "di", "ne", "qua", "tor", "in", "ble", "cha", "os", "mi",
    "der", "an", "tu", "ge", "lo", "fi", "zen", "ar", "ho", "pe", "stra", "ul", "ny", "bo", "com", "ex", "re", "na",
    "ti", "vo", "gra", "is", "um", "pha", "dre", "sy", "wen", "ka", "ol", "et",
];
const PUNCTUATION: [&str; 6] = [",", ".", ";", ":", "?", "\n"];

/// The synthetic language: words and how often each is drawn.
pub struct Language {
    words: Vec<String>,
    /// Cumulative Zipf weights (s = 1.07), for sampling.
    cumulative: Vec<f64>,
}

impl Language {
    pub fn new(distinct_words: usize, seed: u64) -> Language {
        let mut rng = fastrand::Rng::with_seed(seed);
        let words: Vec<String> = (0..distinct_words)
            .map(|_| {
                let syllables = 2 + rng.usize(0..3);
                (0..syllables).map(|_| SYLLABLES[rng.usize(0..SYLLABLES.len())]).collect()
            })
            .collect();
        let mut total = 0.0;
        let cumulative = (1..=distinct_words)
            .map(|rank| {
                total += 1.0 / (rank as f64).powf(1.07);
                total
            })
            .collect();
        Language { words, cumulative }
    }

    fn word(&self, rng: &mut fastrand::Rng) -> &str {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        let x = rng.f64() * total;
        let at = self.cumulative.partition_point(|c| *c < x).min(self.words.len() - 1);
        &self.words[at]
    }

    /// `n` words of running text (sentences with punctuation).
    pub fn text(&self, n: usize, seed: u64) -> String {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut out = String::with_capacity(n * 8);
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(self.word(&mut rng));
            if rng.u8(0..10) == 0 {
                out.push_str(PUNCTUATION[rng.usize(0..PUNCTUATION.len())]);
            }
        }
        out
    }
}

/// A model directory on disk, removed on drop.
pub struct BenchModel {
    dir: PathBuf,
    pub language: Language,
    pub vocab_size: usize,
}

impl BenchModel {
    /// Trains a `vocab_size` tokenizer (a few seconds at 32,000) and writes
    /// the directory under the system temp dir.
    pub fn build(vocab_size: usize) -> Result<BenchModel, String> {
        let language = Language::new(60_000, 0x70c3);
        let corpus: Vec<String> = (0..300).map(|i| language.text(5_000, i)).collect();
        let specials: Vec<AddedToken> =
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].iter().map(|s| AddedToken::from(*s, true)).collect();
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(specials)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let mut tokenizer: TokenizerImpl<BPE, tokenizers::NormalizerWrapper, ByteLevel, TemplateProcessing, ByteLevel> =
            TokenizerImpl::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        tokenizer.train(&mut trainer, corpus.iter()).map_err(|e| format!("training the bench tokenizer: {e}"))?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("kvpick-bench-model-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let model = BenchModel { dir, language, vocab_size: tokenizer.get_vocab_size(true) };
        tokenizer
            .save(model.dir.join("tokenizer.json"), false)
            .map_err(|e| format!("saving the bench tokenizer: {e}"))?;
        let config = serde_json::json!({
            "bos_token": null,
            "eos_token": "<|im_end|>",
            "chat_template": CHATML,
        });
        std::fs::write(model.dir.join("tokenizer_config.json"), config.to_string())
            .map_err(|e| format!("writing tokenizer_config.json: {e}"))?;
        Ok(model)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for BenchModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
