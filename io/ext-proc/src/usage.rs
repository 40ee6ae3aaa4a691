//! Token usage from the engine's response, for metrics: the `usage` object
//! of a JSON body, or of SSE `data:` events whose lines may be split across
//! any number of body chunks.
//!
//! Chat and completions report `prompt_tokens`, `completion_tokens` and
//! `prompt_tokens_details.cached_tokens`; the Responses API reports
//! `input_tokens`, `output_tokens` and `input_tokens_details.cached_tokens`,
//! nested under `response` in its streamed events. Memory is bounded: a
//! JSON body is kept up to a cap, an SSE line up to [`MAX_SSE_LINE`].

use serde::Deserialize;

/// Longest SSE line kept while waiting for its end; longer lines are
/// skipped (a usage event is a few hundred bytes).
pub const MAX_SSE_LINE: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(default)]
    response: Option<Inner>,
}

#[derive(Deserialize)]
struct Inner {
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
    #[serde(default)]
    input_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// The usage in one JSON document, if it has one.
fn usage_of(json: &[u8]) -> Option<Usage> {
    let envelope: Envelope = serde_json::from_slice(json).ok()?;
    let raw = envelope.usage.or(envelope.response.and_then(|r| r.usage))?;
    let details = raw.prompt_tokens_details.or(raw.input_tokens_details);
    Some(Usage {
        prompt_tokens: raw.prompt_tokens.or(raw.input_tokens).unwrap_or(0),
        completion_tokens: raw.completion_tokens.or(raw.output_tokens).unwrap_or(0),
        cached_tokens: details.and_then(|d| d.cached_tokens),
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Reads usage from a response body fed chunk by chunk.
#[derive(Debug)]
pub struct UsageParser {
    mode: Mode,
    buf: Vec<u8>,
    found: Option<Usage>,
    /// SSE `data:` events other than `[DONE]` and usage-only ones: about
    /// one per output token in vLLM's and SGLang's streams.
    events: u64,
}

#[derive(Debug)]
enum Mode {
    /// Keep the body (up to `cap` bytes) and parse it at the end.
    Json { cap: usize, overflowed: bool },
    /// Parse each complete `data:` line; `skipping` drops an overlong line
    /// up to its end.
    Sse { skipping: bool },
}

impl UsageParser {
    pub fn json(cap: usize) -> Self {
        UsageParser { mode: Mode::Json { cap, overflowed: false }, buf: Vec::new(), found: None, events: 0 }
    }

    pub fn sse() -> Self {
        UsageParser { mode: Mode::Sse { skipping: false }, buf: Vec::new(), found: None, events: 0 }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        match &mut self.mode {
            Mode::Json { cap, overflowed } => {
                if *overflowed {
                    return;
                }
                if self.buf.len() + chunk.len() > *cap {
                    *overflowed = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            Mode::Sse { skipping } => {
                let mut rest = chunk;
                while let Some(end) = rest.iter().position(|&b| b == b'\n') {
                    let (line, tail) = rest.split_at(end);
                    rest = &tail[1..];
                    if std::mem::take(skipping) {
                        self.buf.clear();
                        continue;
                    }
                    if self.buf.is_empty() {
                        Self::sse_line(&mut self.found, &mut self.events, line);
                    } else {
                        self.buf.extend_from_slice(line);
                        let whole = std::mem::take(&mut self.buf);
                        Self::sse_line(&mut self.found, &mut self.events, &whole);
                        self.buf = whole;
                        self.buf.clear();
                    }
                }
                if !*skipping {
                    if self.buf.len() + rest.len() > MAX_SSE_LINE {
                        *skipping = true;
                        self.buf.clear();
                    } else {
                        self.buf.extend_from_slice(rest);
                    }
                }
            }
        }
    }

    fn sse_line(found: &mut Option<Usage>, events: &mut u64, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else { return };
        if data.trim_ascii() == b"[DONE]" {
            return;
        }
        // A usage-only event (`"choices":[]`) carries no token.
        if contains(data, b"\"usage\"") {
            if let Some(usage) = usage_of(data) {
                *found = Some(usage);
            }
            if contains(data, b"\"choices\":[]") {
                return;
            }
        }
        *events += 1;
    }

    /// SSE events seen so far that may carry output (0 for a JSON body).
    pub fn sse_events(&self) -> u64 {
        self.events
    }

    /// The last usage seen (SSE), or the body's (JSON); `None` if the
    /// response carried none.
    pub fn finish(mut self) -> Option<Usage> {
        match self.mode {
            Mode::Json { overflowed: false, .. } => usage_of(&self.buf),
            Mode::Json { overflowed: true, .. } => None,
            Mode::Sse { skipping } => {
                // A last line without its newline.
                if !skipping && !self.buf.is_empty() {
                    let rest = std::mem::take(&mut self.buf);
                    Self::sse_line(&mut self.found, &mut self.events, &rest);
                }
                self.found
            }
        }
    }
}

#[cfg(test)]
mod tests;
