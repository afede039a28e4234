"""A choice's routed experts in a JSON response (enable_return_routed_experts), as vLLM sends
them: the array as a `.npy` byte stream, base64-encoded; a client reads it back with
`np.load(io.BytesIO(base64.b64decode(s)))`."""

from __future__ import annotations

import base64
import io

import numpy as np


def encode_routed_experts(routed_experts: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, routed_experts, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")
