"""A CPU stand-in for the CUDA path's host work: the model runs its Triton layers and the triton
attention backend, and every Triton launch does all of its Python (launcher checks, Triton's
binder, specialization, cache lookup) but the driver call, against a fake CUDA driver. Outputs
are garbage; only host time means anything. For benchmarks (profile_prefill_host.py
--fake-launch), never for the engine.
"""

from __future__ import annotations

import torch


class _NoLaunchKernel:
    """What Triton's cache holds for a compiled kernel, minus the kernel."""

    function = None
    packed_metadata = None

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        return None


class _FakeCudaDriver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)  # H100/H200

    def get_device_interface(self):
        return torch.cuda


def install_fake_launch() -> None:
    """Makes every Triton launch in this process a no-op after its host-side work, and the
    engine's layers use their Triton paths on the CPU (the sampler keeps its torch path, so
    that sampled ids stay valid token ids)."""
    import triton.runtime.jit as jit
    from triton.runtime.driver import driver

    import minivllm.attention.selector as selector
    import minivllm.model_loader as model_loader

    driver.set_active(_FakeCudaDriver())

    def no_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel = _NoLaunchKernel()
        self.device_caches[device][0][key] = kernel
        return kernel

    jit.JITFunction._do_compile = no_compile
    model_loader.use_triton_kernels = lambda device: True
    selector.resolve_backend_name = lambda name, device: "triton"
