"""Registers, spills and shared memory of the logprobs' two passes (kernels/logprobs.py) on
Hopper, without a GPU: both compiled for sm_90 through token_logprobs on meta tensors, with
benchmarks/kernels/kernel_resources.py's stub driver (nothing runs), at Qwen3's vocabulary
(151,936), 1,024 rows and the most top logprobs the kernels take, for bf16 and float32 logits,
every row and a list of rows. One JSON line.

    python -m tests.kernels.logprobs_resources      (from the repository root)
"""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
os.environ.update(TRITON_ALWAYS_COMPILE="1", TRITON_DUMP_PTXAS_LOG="1")
import torch  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from benchmarks.kernels.kernel_resources import _Capture, _StubDriver, meta, resources  # noqa: E402
from minivllm.kernels import logprobs  # noqa: E402

ROWS, VOCAB = 1024, 151936
KERNELS = {"slices": "_chunk_kernel", "rows": "_row_kernel"}
KEEP = ("n_regs", "n_spills", "spill_bytes", "shared", "ctas_per_sm", "num_warps", "sass_insts")


def both(dtype: torch.dtype, some_rows: bool) -> dict:
    """The two kernels of one token_logprobs launch (one call compiles both)."""
    kernels = {name: getattr(logprobs, name) for name in KERNELS.values()}
    captures = {name: _Capture(kernel) for name, kernel in kernels.items()}
    vars(logprobs).update(captures)
    rows = meta(ROWS, dtype=torch.int64) if some_rows else None
    try:
        with redirect_stdout(io.StringIO()) as log:  # the ptxas log is printed
            logprobs.token_logprobs(meta(ROWS, VOCAB, dtype=dtype), meta(ROWS, dtype=torch.int64),
                                    logprobs.MAX_TOP_K, rows)  # fmt: skip
    finally:
        vars(logprobs).update(kernels)
    figures = {part: resources(captures[name].compiled, log.getvalue())
               for part, name in KERNELS.items()}  # fmt: skip
    return {part: {key: every[key] for key in KEEP} for part, every in figures.items()}


def main() -> None:
    driver.set_active(_StubDriver())
    print(json.dumps({
        f"{str(dtype).removeprefix('torch.')}/{'rows' if some else 'all'}": both(dtype, some)
        for dtype in (torch.bfloat16, torch.float32) for some in (False, True)
    }))  # fmt: skip


if __name__ == "__main__":
    main()
