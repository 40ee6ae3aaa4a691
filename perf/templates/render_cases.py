#!/usr/bin/env python3
"""Render every template in TEMPLATES_DIR with transformers' own chat-template renderer
and write OUT.jsonl (one case per line), for `kvpick-check-templates OUT.jsonl`.

Usage: render_cases.py TEMPLATES_DIR OUT.jsonl
Requires: pip install transformers jinja2 (no PyTorch needed)
The templates are not part of this repository: copy them in from wherever
they come from (e.g. vLLM's examples/*.jinja, or the models you serve).

Semantics (transformers 5.x, transformers/utils/chat_template_utils.py):
  render_jinja_template(conversations, tools=None, documents=None, chat_template=None,
                        return_assistant_tokens_mask=False, continue_final_message=False,
                        add_generation_prompt=False, **kwargs) -> (list[str], list)
  It returns a TUPLE (rendered_list, generation_indices); rendered_list has one string per
  conversation.  Before rendering, each conversation is passed through
  _plain_template_data (copy into plain JSON types) and _alias_reasoning_fields
  (copies reasoning/thinking/reasoning_content into each other); tools/documents/kwargs go
  through _plain_template_data.  The template is rendered with
  messages, tools, documents, add_generation_prompt, **kwargs.
We record the messages AFTER those two transformations (recomputed with the same helpers).

strftime_now() in transformers calls the module-level `datetime.now()`; we pin it to a fixed
instant (FIXED_NOW) so date-dependent templates are reproducible.  Each line carries "now".
"""
import json
import os
import sys
from datetime import datetime as _real_datetime

import transformers.utils.chat_template_utils as ctu
from transformers.utils.chat_template_utils import render_jinja_template

if len(sys.argv) != 3:
    sys.exit("usage: render_cases.py TEMPLATES_DIR OUT.jsonl")
TEMPLATES, OUT = sys.argv[1], sys.argv[2]

FIXED_NOW = _real_datetime(2025, 1, 15, 10, 30, 0)  # a Wednesday


class _FixedDatetime(_real_datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW if tz is None else FIXED_NOW.replace(tzinfo=tz)


ctu.datetime = _FixedDatetime  # used by strftime_now inside the compiled environment

BOS = "<s>"
EOS = "</s>"

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER1 = {"role": "user", "content": "Hello! How are you?"}
ASSISTANT1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help you today?"}
USER2 = {"role": "user", "content": "What's the weather like in Paris?"}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city — données météo / 天気",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "object",
                        "description": "Where to look up the weather (Ort, 場所)",
                        "properties": {
                            "city": {"type": "string", "description": "City name, e.g. São Paulo or 東京"},
                            "country": {"type": "string", "enum": ["BR", "FR", "JP"]},
                        },
                        "required": ["city"],
                    },
                    "unit": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "description": "Temperature unit",
                    },
                    "threshold": {
                        "type": "number",
                        "description": "Alert threshold in degrees",
                        "default": 0.75,
                    },
                },
                "required": ["location", "unit"],
            },
        },
    }
]

TOOL_CALL_ID = "abc123xyz"  # 9 alphanumerics: satisfies the Mistral templates' id checks

CONVERSATIONS = [
    # (case id, messages, tools, add_generation_prompt)
    ("a_sys_user_asst_user_gen", [SYSTEM, USER1, ASSISTANT1, USER2], None, True),
    ("b_sys_user_asst_user_nogen", [SYSTEM, USER1, ASSISTANT1, USER2], None, False),
    (
        "c_tool_call_roundtrip",
        [
            {"role": "user", "content": "What's the weather in São Paulo? Use celsius."},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": TOOL_CALL_ID,
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": {
                                "location": {"city": "São Paulo", "country": "BR"},
                                "unit": "celsius",
                                "threshold": 21.5,
                            },
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": TOOL_CALL_ID,
                "content": '{"temperature": 22.5, "condition": "ensolarado ☀"}',
            },
        ],
        TOOLS,
        True,
    ),
    ("d_single_user", [{"role": "user", "content": "Hello! How are you?"}], None, True),
]


def transformed_messages(messages):
    """Exactly what render_jinja_template hands to the template as `messages`."""
    return ctu._alias_reasoning_fields(ctu._plain_template_data(messages))


def main():
    names = sorted(os.listdir(TEMPLATES))
    n_cases = n_err = 0
    with open(OUT, "w", encoding="utf-8") as out:
        for name in names:
            with open(os.path.join(TEMPLATES, name), encoding="utf-8", newline="") as f:
                template = f.read()
            for case_id, messages, tools, agp in CONVERSATIONS:
                context = {
                    "messages": transformed_messages(messages),
                    "tools": ctu._plain_template_data(tools),
                    "documents": None,
                    "add_generation_prompt": agp,
                    "bos_token": BOS,
                    "eos_token": EOS,
                }
                rec = {"template_name": name, "case": case_id, "now": FIXED_NOW.isoformat(),
                       "template": template, "context": context}
                try:
                    rendered, _gen_idx = render_jinja_template(
                        conversations=[json.loads(json.dumps(messages))],
                        tools=json.loads(json.dumps(tools)) if tools is not None else None,
                        documents=None,
                        chat_template=template,
                        add_generation_prompt=agp,
                        bos_token=BOS,
                        eos_token=EOS,
                    )
                    assert isinstance(rendered, list) and len(rendered) == 1
                    rec["expected"] = rendered[0]
                except Exception as e:  # noqa: BLE001 - record whatever transformers raises
                    rec["error"] = f"{type(e).__name__}: {e}"
                    n_err += 1
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_cases += 1
    print(f"templates={len(names)} cases={n_cases} errors={n_err}", file=sys.stderr)


if __name__ == "__main__":
    main()
