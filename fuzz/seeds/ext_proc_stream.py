#!/usr/bin/env python3
"""Writes the ext_proc_stream fuzz target's seed corpus: real exchanges in
the target's byte format (see fuzz_targets/ext_proc_stream.rs).

    python3 fuzz/seeds/ext_proc_stream.py   # from the repository root
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(__file__), "..", "corpus", "ext_proc_stream")

BOOK, NO_BOOKING, REFUSE = 0, 2, 3
FULL_DUPLEX, BUFFERED = 4, 2


def modes(request=None, response=None, small_body=False):
    b = 0x40 if small_body else 0
    if request is not None:
        b |= 0x80 | request | (response << 3)
    return b


def headers(path=0, eos=False, untrusted=False, subset=None, observe=False):
    flags = (path << 3) | (1 if eos else 0) | (2 if observe else 0) | (0x40 if untrusted else 0)
    if subset is not None:
        flags |= 0x80 | (4 if subset == "none" else 0)
    return bytes([0, flags])


def body(data, eos=False, response=False, observe=False):
    return bytes([4 if response else 1, (1 if eos else 0) | (2 if observe else 0)]) + struct.pack("<H", len(data)) + data


def trailers(response=False):
    return bytes([5 if response else 2, 0])


def response_headers(status=0, stream=True, served=None, eos=False):
    flags = (status << 2) | (0x10 if stream else 0) | (1 if eos else 0)
    if served is not None:
        flags |= 0x20 | (0x40 if served == "other" else 0)
    return bytes([3, flags])


def flow_control():
    return bytes([6, 0])


CHAT = json.dumps({
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}],
    "stream": True,
    "stream_options": {"include_usage": True},
}).encode()
COMPLETION = json.dumps({"model": "m", "prompt": "Once upon a time", "max_tokens": 8}).encode()
SSE = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"7"}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":1,"total_tokens":21}}\n\n',
    b"data: [DONE]\n\n",
]
JSON_ANSWER = json.dumps({
    "id": "c2", "object": "text_completion",
    "choices": [{"index": 0, "text": " there", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12},
}).encode()


def streamed_response(served="picked"):
    out = response_headers(stream=True, served=served)
    for chunk in SSE[:-1]:
        out += body(chunk, response=True)
    return out + body(SSE[-1], eos=True, response=True)


SEEDS = {
    "chat_full_duplex_streamed": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers() + body(CHAT, eos=True) + streamed_response(),
    "chat_buffered": bytes([BOOK, modes(BUFFERED, BUFFERED)]) + headers() + body(CHAT, eos=True) + streamed_response(),
    "no_protocol_config": bytes([BOOK, modes()]) + headers() + body(CHAT, eos=True) + streamed_response() + trailers(response=True),
    "body_in_three_chunks": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers()
    + body(CHAT[:10]) + flow_control() + body(CHAT[10:40]) + body(CHAT[40:], eos=True) + streamed_response(),
    "cancel_mid_body": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers() + body(CHAT[:30]),
    "cancel_mid_response": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers() + body(CHAT, eos=True)
    + response_headers(stream=True, served="picked") + body(SSE[0], response=True),
    "request_trailers_end_body": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers(path=1) + body(COMPLETION) + trailers()
    + response_headers(stream=False) + body(JSON_ANSWER, eos=True, response=True),
    "headers_only_models": bytes([NO_BOOKING, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers(path=2, eos=True)
    + response_headers(stream=False, eos=True),
    "picker_refuses": bytes([REFUSE, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers() + body(CHAT, eos=True)
    + response_headers() + body(SSE[0], response=True),
    "body_too_large": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX, small_body=True)]) + headers()
    + body(CHAT * 3, eos=True) + body(b"x", eos=True),
    "untrusted_headers_and_subset": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers(untrusted=True, subset="two")
    + body(CHAT, eos=True) + streamed_response(served="other"),
    "subset_names_no_pod": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers(subset="none") + body(CHAT, eos=True),
    "observability_mode": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers(observe=True)
    + body(CHAT, eos=True, observe=True) + streamed_response(),
    "invalid_body_mode": bytes([BOOK, modes(5, 1)]) + headers() + body(CHAT, eos=True),
    "not_json": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers() + body(b"{\"model\": ", eos=True) + streamed_response(),
    "response_before_request": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + streamed_response() + headers() + body(CHAT, eos=True),
    "headers_twice": bytes([BOOK, modes(FULL_DUPLEX, FULL_DUPLEX)]) + headers() + headers() + body(CHAT, eos=True)
    + response_headers(status=1, stream=False) + body(b'{"error":"boom"}', eos=True, response=True),
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, "seed-" + name), "wb") as f:
        f.write(data)
print(f"wrote {len(SEEDS)} seeds to {os.path.normpath(OUT)}")
