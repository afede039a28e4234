"""Kernel tests run the Triton interpreter on CPU; it must be chosen before triton is imported."""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py)"
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")
