//! Support for tests and benchmarks: a deterministic in-process
//! [`Tokenizer`]. Not for production: real deployments tokenize with the
//! engine's own tokenizer service (`crate::tokenizer`).

pub mod gateway;

use std::borrow::Cow;

use serde::Deserialize;

use crate::tokenizer::{TokenizeError, TokenizeFuture, TokenizeRequest, Tokenizer};

/// One token per whitespace-separated word of the chat messages' text (or
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

#[derive(Deserialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Parts(#[serde(borrow)] Vec<Part<'a>>),
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

/// FNV-1a, 32 bits: stable across runs and platforms.
fn word_token(word: &str) -> u32 {
    word.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

impl WordTokenizer {
    /// The tokens of a chat or completions body.
    pub fn tokens(body: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        let body: Body<'_> = serde_json::from_slice(body)
            .map_err(|e| TokenizeError::Rejected { status: 400, message: e.to_string() })?;
        let mut tokens = Vec::new();
        let mut add = |text: &str| tokens.extend(text.split_whitespace().map(word_token));
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
    }
}
