"""InputStaging: a step's mixed-dtype arrays reach the device unchanged, in one transfer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.engine.runner.device_inputs import InputStaging


def _arrays(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "ids": rng.integers(-(2**62), 2**62, n, dtype=np.int64),
        "odd": rng.integers(-5, 5, 2 * n + 1, dtype=np.int32),  # odd byte count: alignment
        "table": rng.integers(0, 1000, (n, 3), dtype=np.int32)[:, ::2],  # not contiguous
        "floats": rng.standard_normal(n).astype(np.float32),
        "empty": np.zeros((0, 4), np.int32),
        "last": rng.integers(0, 10, n, dtype=np.int64),
    }


def _check(staging: InputStaging, device: str) -> None:
    rng = np.random.default_rng(0)
    kept = []
    for step, n in enumerate([3, 1, 700, 5, 2000, 9, 1]):  # 2000 outgrows the first buffer
        arrays = _arrays(rng, n)
        out = staging.upload(arrays)
        kept.append((arrays, out))
        assert list(out) == list(arrays)
        for name, array in arrays.items():
            tensor = out[name]
            assert tensor.device.type == device
            assert tuple(tensor.shape) == array.shape, name
            np.testing.assert_array_equal(tensor.cpu().numpy(), array, err_msg=f"{step} {name}")
    # Earlier steps' device tensors are not overwritten by later uploads.
    for arrays, out in kept:
        for name, array in arrays.items():
            np.testing.assert_array_equal(out[name].cpu().numpy(), array)


def test_upload_cpu_round_trips_every_dtype_and_shape():
    _check(InputStaging(torch.device("cpu")), "cpu")


def test_upload_rejects_other_dtypes():
    with pytest.raises(TypeError, match="int64, int32 and float32"):
        InputStaging(torch.device("cpu")).upload({"x": np.zeros(3, np.float64)})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_upload_cuda_ring_reuse_keeps_values():
    # A small capacity and two slots: every slot is reused and grown several times.
    _check(InputStaging(torch.device("cuda"), num_slots=2, capacity=64), "cuda")
