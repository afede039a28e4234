"""A completion's and a chat completion's choices carry `routed_experts` as vLLM sends them
(enable_return_routed_experts: a base64 `.npy` stream of the CompletionOutput's array), and
nothing without it. (The array itself: tests/models/test_routed_experts.py; the flag reaches
the server's engine as every EngineConfig field does, tests/entrypoints/test_cli.py.)"""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import numpy as np

from minivllm.entrypoints.openai.chat.output import ChatOutputSpec
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from minivllm.entrypoints.openai.routed_experts import encode_routed_experts
from minivllm.entrypoints.openai.serving_chat import ChatRun, _ChatResponse
from minivllm.entrypoints.openai.serving_completion import _Response
from minivllm.outputs import CompletionOutput, RequestOutput

STATE = SimpleNamespace(engine=SimpleNamespace(tokenizer=None), model_name="tiny")
ROUTED = np.arange(18, dtype=np.uint8).reshape(3, 3, 2)  # [3 tokens, 3 sparse layers, top-2]


def output(routed: np.ndarray | None) -> RequestOutput:
    choice = CompletionOutput(0, "ab", [7, 8], finish_reason="length", routed_experts=routed)
    return RequestOutput("r", None, [1, 2], [choice], finished=True)


def decode(choice: dict) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])), allow_pickle=False)


def test_completion_choices() -> None:
    response = _Response(STATE, CompletionRequest(model="tiny", prompt=[1, 2]), "id", [None])
    [choice] = response.full([output(ROUTED)])["choices"]
    np.testing.assert_array_equal(decode(choice), ROUTED)
    assert decode(choice).dtype == np.uint8
    [plain] = response.full([output(None)])["choices"]
    assert "routed_experts" not in plain


def test_chat_choices() -> None:
    req = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])
    response = _ChatResponse(STATE, req, "id", ChatRun([], ChatOutputSpec(), [1, 2], 0))
    [choice] = response.full(output(ROUTED))["choices"]
    np.testing.assert_array_equal(decode(choice), ROUTED)
    [plain] = response.full(output(None))["choices"]
    assert "routed_experts" not in plain


def test_encoding_is_np_save() -> None:
    """Byte for byte what np.save writes, with the stream's cache of headers or without,
    for the dtypes the engine records (uint8, int16), empty arrays and non-contiguous views."""
    headers: dict = {}
    wide = np.arange(5 * 48 * 8, dtype=np.int16).reshape(5, 48, 8)
    for rows in [ROUTED, ROUTED[1:2], ROUTED[:0], wide, wide[::2], wide[3:], ROUTED[2:3]]:
        buf = io.BytesIO()
        np.save(buf, rows, allow_pickle=False)
        expected = base64.b64encode(buf.getvalue()).decode("ascii")
        assert encode_routed_experts(rows) == encode_routed_experts(rows, headers) == expected
    assert len(headers) == 6  # ROUTED[1:2] and ROUTED[2:3] share one
