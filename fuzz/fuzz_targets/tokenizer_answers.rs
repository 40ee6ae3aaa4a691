//! Arbitrary bytes as a tokenizer's answer: vLLM's chat render (one
//! `GenerateRequest`), its completions render (a list of them, or one) and
//! SGLang's `/tokenize`. Byte 0 picks the decoder; the rest is the answer.
//!
//! What must hold: no panic, and (regression guards: neither can fail with
//! today's decoders) at least one prompt counted whenever the completions
//! decoder answers, and the chat and completions decoders agreeing on a
//! single rendered prompt. Shapes other than the documented ones are not
//! all refused: serde reads a struct written as a JSON array too, so
//! `[[1,2]]` decodes as tokens `[1, 2]`; no engine answers that, and a wrong
//! prompt costs a worse pick, not a wrong answer to the client.
#![no_main]

use kvpick_router::tokenizer::{SglangTokenizer, VllmRenderTokenizer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, answer)) = data.split_first() else { return };
    match which % 3 {
        0 => {
            let chat = VllmRenderTokenizer::decode_chat(answer);
            // A single `GenerateRequest` is also a valid completions answer
            // (vLLM answers one object for one prompt in some versions).
            if let (Ok(chat), Ok((completions, prompts))) = (&chat, VllmRenderTokenizer::decode_completions(answer)) {
                assert_eq!(prompts, 1);
                assert_eq!(chat, &completions, "chat and completions decoders disagree on one prompt");
            }
        }
        1 => {
            if let Ok((_, prompts)) = VllmRenderTokenizer::decode_completions(answer) {
                assert!(prompts >= 1, "tokens without a prompt");
            }
        }
        _ => {
            let _ = SglangTokenizer::decode_tokens(answer);
        }
    }
});
