//! kvpick-test-support: what several crates' tests, the benchmarks and
//! the demo share. Never part of a serving path.
//!
//! - [`WordTokenizer`]: a deterministic in-process [`Tokenizer`] (real
//!   deployments tokenize with the engine's own tokenizer service,
//!   `kvpick_router::tokenizer`).
//! - [`gateway`]: a miniature GAIE gateway driving the ext_proc stream as
//!   Envoy does, in front of real HTTP engines.
//! - [`fake_kube`]: a fake Kubernetes API server on 127.0.0.1 (LIST with
//!   pagination, chunked WATCH, bookmarks, 410 Gone, dropped watches).
//! - [`otlp_collector`]: an OTLP/gRPC trace collector stand-in on
//!   127.0.0.1 that keeps every span it is sent.
//! - [`nats_server`]: a real `nats-server` with JetStream on 127.0.0.1.

pub mod fake_kube;
pub mod gateway;
pub mod nats_server;
pub mod otlp_collector;

use std::borrow::Cow;

use serde::Deserialize;

use kvpick_router::tokenizer::{TokenizeError, TokenizeFuture, TokenizeRequest, Tokenizer};

/// One token per (ASCII-)whitespace-separated word of the chat messages' text (or
/// the completion prompt), the token being a hash of the word: equal text
/// prefixes give equal token prefixes, as with a real tokenizer.
#[derive(Clone, Copy, Debug, Default)]
pub struct WordTokenizer;

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    messages: Vec<Message<'a>>,
    #[serde(borrow, default)]
    prompt: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
}

/// A string or a list of parts. Deserialized by hand: serde's `untagged`
/// buffers the whole value (a copy of every message) to try each variant.
enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Content<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of content parts")
            }

            fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(text)))
            }

            // Strings with escapes arrive unescaped, in a buffer of serde_json's.
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(text.to_owned())))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some(part) = seq.next_element()? {
                    parts.push(part);
                }
                Ok(Content::Parts(parts))
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Text<'a> {
    One(#[serde(borrow)] Cow<'a, str>),
    Other(serde::de::IgnoredAny),
}

/// A word's token: a multiply–rotate hash over 8-byte little-endian
/// chunks, stable across runs and platforms. It stands in for a real
/// tokenizer in benchmarks, so it should cost little next to kvpick's own
/// work: byte-at-a-time FNV-1a with Unicode whitespace splitting was
/// ~28 µs of a 1,000-word prompt's ~80 µs on the I/O thread.
fn word_token(word: &[u8]) -> u32 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = word.len() as u64;
    // The last chunk may be short: zero-padded to 8 bytes.
    for chunk in word.chunks(8) {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(bytes)).wrapping_mul(K);
    }
    (h >> 32) as u32 ^ h as u32
}

/// Appends one token per run of non-whitespace bytes (ASCII whitespace
/// separates words; other bytes, UTF-8 included, belong to them).
fn add_words(text: &str, tokens: &mut Vec<u32>) {
    tokens.extend(text.as_bytes().split(u8::is_ascii_whitespace).filter(|w| !w.is_empty()).map(word_token));
}

impl WordTokenizer {
    /// The tokens of a chat or completions body.
    pub fn tokens(body: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        let body_len = body.len();
        let body: Body<'_> = serde_json::from_slice(body)
            .map_err(|e| TokenizeError::Rejected { status: 400, message: e.to_string() })?;
        let mut tokens = Vec::with_capacity(body_len / 6);
        let mut add = |text: &str| add_words(text, &mut tokens);
        for message in &body.messages {
            match &message.content {
                Some(Content::Text(text)) => add(text),
                Some(Content::Parts(parts)) => parts.iter().filter_map(|p| p.text.as_deref()).for_each(&mut add),
                None => {}
            }
        }
        if let Some(Text::One(prompt)) = &body.prompt {
            add(prompt);
        }
        Ok(tokens)
    }
}

impl Tokenizer for WordTokenizer {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_> {
        Box::pin(async move { WordTokenizer::tokens(&request.body) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_shares_tokens() {
        let a = WordTokenizer::tokens(br#"{"messages":[{"role":"user","content":"a b c d"}]}"#);
        let b =
            WordTokenizer::tokens(br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a b c e"}]}]}"#);
        let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
        assert_eq!(a.len(), 4);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
        assert_eq!(WordTokenizer::tokens(br#"{"prompt":"x y"}"#).map(|t| t.len()), Ok(2));
        // Escaped text (unescaped into a buffer) tokenizes like plain text.
        let escaped = WordTokenizer::tokens(br#"{"messages":[{"content":"a \"b\" c"},{"content":null}]}"#);
        let plain = WordTokenizer::tokens(br#"{"messages":[{"content":"a b c"}]}"#);
        let (escaped, plain) = (escaped.unwrap_or_default(), plain.unwrap_or_default());
        assert_eq!((escaped.len(), escaped[0], escaped[2]), (3, plain[0], plain[2]));
        assert!(WordTokenizer::tokens(br#"{"messages":[{"content":7}]}"#).is_err());
        let spaced = WordTokenizer::tokens(br#"{"prompt":"  x\t y\n\nlonger-than-eight-bytes "}"#).unwrap_or_default();
        assert_eq!(spaced.len(), 3);
        let words: std::collections::HashSet<u32> =
            (0..10_000).map(|i| word_token(format!("w{i}").as_bytes())).collect();
        assert_eq!(words.len(), 10_000, "distinct short words get distinct tokens");
    }
}
