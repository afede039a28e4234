"""LLM.chat with tools: OpenAI-shaped messages (an assistant's tool_calls with JSON-text
arguments, role "tool" with tool_call_id) and tools render as transformers' own
apply_chat_template renders the same conversation in its documented form."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from minivllm import LLM, SamplingParams

# A tool-aware template in the Hermes style: tools in the system turn, earlier calls as
# <tool_call> JSON (arguments | tojson: templates expect a dict), results with their call id.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    '{% for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}", '
    '"arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}'
    "{% if m.role == 'tool' %} (for {{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ARGUMENTS = {"city": "Oslo", "note": 'é "quoted"'}
OPENAI_MESSAGES = [
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
]
# The same conversation as transformers documents it: arguments as a dict, text content.
HF_MESSAGES = [
    OPENAI_MESSAGES[0],
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ARGUMENTS},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str) -> LLM:
    return LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)


def hf_ids(model_dir: str, **kwargs) -> list[int]:
    ids = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        HF_MESSAGES, tokenize=True, chat_template=TOOL_TEMPLATE, **kwargs
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_tools_and_tool_messages_render_as_transformers(llm: LLM, tiny_qwen3_dir: str):
    out = llm.chat(
        OPENAI_MESSAGES, GREEDY, use_tqdm=False, tools=TOOLS, chat_template=TOOL_TEMPLATE
    )[0]
    expected = hf_ids(tiny_qwen3_dir, tools=TOOLS, add_generation_prompt=True)
    assert out.prompt_token_ids == expected
    assert '"name": "get_weather"' in out.prompt and "(for call_1)" in out.prompt
    assert json.dumps(ARGUMENTS, ensure_ascii=False) in out.prompt  # the dict, via tojson
    # The output is the model's text (vLLM's LLM.chat: parsing calls is the server's).
    assert len(out.outputs[0].token_ids) == 4 and isinstance(out.outputs[0].text, str)


def test_without_tools_the_template_sees_none(llm: LLM, tiny_qwen3_dir: str):
    out = llm.chat(
        OPENAI_MESSAGES, GREEDY, use_tqdm=False, chat_template=TOOL_TEMPLATE,
        add_generation_prompt=False,
    )[0]  # fmt: skip
    assert out.prompt_token_ids == hf_ids(tiny_qwen3_dir, add_generation_prompt=False)
    assert "Tools:" not in out.prompt


@pytest.mark.parametrize(
    "messages, kwargs, match",
    [
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"function": {"name": "f", "arguments": "[" * 10**5 + "]" * 10**5}}
                    ],
                }
            ],
            {},
            "arguments are nested too deeply",
        ),
        ([{"content": "hi"}], {}, "role"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], {}, "text content parts"),
        (OPENAI_MESSAGES[:1], {"chat_template_kwargs": {"tools": TOOLS}}, "tools"),
    ],
)
def test_bad_messages_are_value_errors(llm: LLM, messages, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False, chat_template=TOOL_TEMPLATE, **kwargs)
