//! kvpick-router's integration tests, one binary: the tokenizer clients
//! against stub engines on 127.0.0.1 (vLLM render, SGLang tokenize, the
//! HTTP transport's limits and errors), and the in-process tokenizer
//! against transformers' fixtures and its parity sampler.

mod tokenizer_stub;

mod local_tokenizer;
mod sglang;
mod transport;
mod vllm_render;
