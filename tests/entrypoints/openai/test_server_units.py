"""In-process pieces of the server: request -> SamplingParams, chat template and
generation-config flags, logprob shapes."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from minivllm.entrypoints.async_llm import _generation_defaults
from minivllm.entrypoints.openai.chat.template import render_chat_text
from minivllm.entrypoints.openai.logprobs import chat_logprobs, completion_logprobs
from minivllm.entrypoints.openai.params import sampling_params, truncate_prompt
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from minivllm.entrypoints.server.api_server import load_chat_template
from minivllm.entrypoints.server.errors import APIError
from minivllm.outputs import Logprob


def _params(body: dict, defaults: dict | None = None, num_prompt: int = 10):
    req = CompletionRequest.model_validate({"prompt": "x", **body})
    return sampling_params(req, defaults or {}, num_prompt, 512, req.max_tokens, req.logprobs)


def test_request_values_override_generation_defaults() -> None:
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    params = _params({"temperature": 0.0}, defaults)
    assert (params.temperature, params.top_p, params.top_k) == (0.0, 0.95, 20)
    assert _params({}, defaults).temperature == 0.6


def test_max_tokens_defaults_to_the_room_left_and_more_is_400() -> None:
    assert _params({}, num_prompt=500).max_tokens == 12
    assert _params({"max_tokens": 12}, num_prompt=500).max_tokens == 12
    assert _params({"max_tokens": 5}, num_prompt=500).max_tokens == 5
    with pytest.raises(APIError, match=r"too large: 13\b.*512 - 500") as e:
        _params({"max_tokens": 13}, num_prompt=500)
    assert e.value.param == "max_tokens"
    with pytest.raises(APIError, match="max_tokens"):
        _params({"max_tokens": -1})


def test_generation_configs_max_new_tokens_is_the_default_max_tokens() -> None:
    """As in vLLM: a request without max_tokens gets max_new_tokens, or the room left where
    that is less; one that says max_tokens gets it."""
    defaults = {"max_tokens": 7, "temperature": 0.6}
    assert _params({}, defaults).max_tokens == 7
    assert _params({}, defaults, num_prompt=508).max_tokens == 4
    assert _params({"max_tokens": 30}, defaults).max_tokens == 30


def test_chat_template_flag(tmp_path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert load_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert load_chat_template("{% if x %}{% endif %}") == "{% if x %}{% endif %}"
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="neither a file"):
        load_chat_template("no-such-file")


def test_generation_config_flag(tiny_qwen3_dir, tmp_path) -> None:
    engine = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(tiny_qwen3_dir))
    other = tmp_path / "gen"
    other.mkdir()
    generation_config = {"temperature": 0.3, "max_new_tokens": 64, "do_sample": True}
    (other / "generation_config.json").write_text(json.dumps(generation_config))
    model_defaults = _generation_defaults(tiny_qwen3_dir, "auto", engine)
    assert len(model_defaults.eos_token_ids) == 2  # <|im_end|> and <|endoftext|>
    assert _generation_defaults(tiny_qwen3_dir, "vllm", engine).sampling == {}
    custom = _generation_defaults(tiny_qwen3_dir, str(other), engine)
    assert custom.sampling == {"temperature": 0.3, "max_tokens": 64}  # vLLM's names
    assert custom.eos_token_ids == model_defaults.eos_token_ids


def test_logprob_shapes(tiny_qwen3_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    entry = {
        7: Logprob(-0.5, 2, "a"),
        9: Logprob(-0.1, 1, "bc"),
        3: Logprob(-float("inf"), 2, "d"),
    }
    out = completion_logprobs([5, 7], [None, entry], 1, tokenizer)
    assert out["token_logprobs"] == [None, -0.5] and out["top_logprobs"][0] is None
    assert out["top_logprobs"][1] == {"a": -0.5, "bc": -0.1}  # sampled first, then top 1
    assert out["text_offset"][1] == len(out["tokens"][0])
    chat = chat_logprobs([7], [entry], 3)["content"][0]
    assert chat["token"] == "a" and chat["bytes"] == [97]
    assert [t["logprob"] for t in chat["top_logprobs"]] == [-0.5, -0.1, -9999.0]


def test_a_grammar_engine_that_cannot_run_is_a_500_saying_why(monkeypatch) -> None:
    from minivllm.entrypoints.openai import constraints
    from minivllm.structured_output import manager
    from minivllm.structured_output.llguidance_backend import check_llguidance_version
    from minivllm.structured_output.params import StructuredOutputsParams

    def old_llguidance(*args, **kwargs) -> None:
        check_llguidance_version("1.3.0")

    # The core's check, as its manager answers it where the backend cannot be built.
    monkeypatch.setattr(manager, "load_tokenizer", lambda path: path)
    monkeypatch.setattr(manager, "LLGuidanceBackend", old_llguidance)
    core_manager = manager.StructuredOutputManager("/nonexistent/old-llguidance", 8, 4)

    async def check_grammar(params, refuse_when_busy=False) -> None:
        core_manager.check(params.spec_key(), refuse_when_busy).result(5).raise_error()

    engine = SimpleNamespace(check_grammar=check_grammar)
    constraint = ("response_format", StructuredOutputsParams(json_object=True))
    with pytest.raises(APIError) as caught:
        asyncio.run(constraints.check_constraint(engine, constraint))
    assert caught.value.status == 500 and caught.value.param == "response_format"
    assert "llguidance >= 1.9, but 1.3.0 is installed" in caught.value.message


def test_reasoning_effort_and_documents_reach_the_chat_template(tiny_qwen3_dir) -> None:
    # As in vLLM: reasoning_effort joins the template's keyword arguments (chat_template_kwargs'
    # own key wins), documents go in as apply_chat_template's argument of that name.
    async def run(fn, *args):
        return fn(*args)

    engine = SimpleNamespace(
        tokenizer=AutoTokenizer.from_pretrained(tiny_qwen3_dir),
        async_tokenizer=SimpleNamespace(run=run),
    )
    template = (
        "{{ reasoning_effort }}|{% for d in documents or [] %}{{ d['title'] }};{% endfor %}"
        "|{{ messages[0]['content'] }}"
    )

    def render(**fields) -> str:
        body = {"messages": [{"role": "user", "content": "hi"}], **fields}
        req = ChatCompletionRequest.model_validate(body)
        kwargs = req.template_kwargs()
        return asyncio.run(
            render_chat_text(
                engine, template, req.messages, True, False, kwargs, None, documents=req.documents
            )  # fmt: skip
        )

    documents = [{"title": "A", "text": "x"}, {"title": "B", "text": "y"}]
    assert render(reasoning_effort="low", documents=documents) == "low|A;B;|hi"
    assert render() == "||hi"
    high = {"reasoning_effort": "high"}
    assert render(reasoning_effort="low", chat_template_kwargs=high) == "high||hi"


def test_truncate_prompt_keeps_k_tokens_on_the_tokenizers_side() -> None:
    # vLLM 0.20's rule: k tokens, -1 for what max_model_len leaves beside max_tokens; the first
    # k on the "right" side (transformers' default), the last k on the "left"; k past that
    # room is a 400.
    ids = list(range(100, 110))

    def cut(keep, side="right", max_tokens=None, max_model_len=512):
        return truncate_prompt(ids, keep, max_model_len, max_tokens, side)

    assert cut(None) == ids and cut(20) == ids
    assert cut(3) == [100, 101, 102] and cut(3, "left") == [107, 108, 109]
    assert cut(-1, "left", max_tokens=504) == ids[2:]  # 512 - 504 = 8 kept
    assert cut(0) == []
    for keep, max_tokens in ((-2, None), (9, 504)):
        with pytest.raises(APIError, match="truncate_prompt_tokens") as e:
            cut(keep, max_tokens=max_tokens)
        assert e.value.param == "truncate_prompt_tokens"
