"""Where a node computes and in which precision: `--device` and `--dtype`, for every role.

    auto   -> CUDA (the current GPU) in bfloat16 where torch sees one, else CPU in float32
    cpu | cuda | cuda:N, and float32 | bfloat16

The learner keeps float32 *master* weights and optimizer state wherever it runs and computes its
forward in the compute dtype under autocast (node/training/step.StepOptions), so bfloat16 changes
speed and memory, not what the optimizer accumulates. Samplers hold their weights in the compute
dtype (the view they sample with).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from node.config import DeviceError, check_spec  # noqa: F401  (the syntax: torch-free, for configs)

@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype
    """The compute dtype: autocast's on a learner, the weights' on a sampler."""

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """What the learner's forward runs in under autocast; None: plain float32."""
        return None if self.dtype == torch.float32 else self.dtype

    def __str__(self) -> str:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"
        return f"{self.device} ({name}), {str(self.dtype).removeprefix('torch.')}"


def resolve(device: str = "auto", dtype: str = "auto") -> Placement:
    """The device and compute dtype a spec names on this machine, or DeviceError (one line + fix)."""
    check_spec(device, dtype)
    has_cuda = torch.cuda.is_available()
    if device == "auto":
        dev = torch.device("cuda", torch.cuda.current_device()) if has_cuda else torch.device("cpu")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and not has_cuda:
            raise DeviceError(f"--device {device}: torch sees no CUDA GPU here (torch {torch.__version__})",
                              "use --device auto or cpu, or install a CUDA build of torch")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s)",
                              f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    if dtype == "auto":
        dt = torch.bfloat16 if dev.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dt = getattr(torch, dtype)
    if dt == torch.bfloat16 and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError(f"--dtype bfloat16: {torch.cuda.get_device_name(dev)} has no bfloat16 support",
                          "use --dtype float32 (or auto)")
    return Placement(dev, dt)


@functools.cache
def matmul_rates(device: str) -> tuple[float, float]:
    """Measured float32 and bfloat16 matrix-product rates on `device`, FLOP/s (once per process:
    a few ms on a GPU, under a second on a CPU). CPUs without bfloat16 units (no AVX512-BF16 or
    AMX) run bfloat16 20-150x slower: this project's 2-core AMD EPYC did a 512x1024x8192 product
    at 24 GFLOPS in float32 and 0.15 in bfloat16."""
    dev = torch.device(device)
    rates = []
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.randn(64, 512, dtype=dt, device=dev), torch.randn(512, 512, dtype=dt, device=dev)
        a @ b  # the first call picks a kernel
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        runs = []
        for _ in range(5):  # the fastest of five: other processes' load only ever adds time
            t0 = time.perf_counter()
            a @ b
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            runs.append(time.perf_counter() - t0)
        rates.append(2 * 64 * 512 * 512 / max(min(runs), 1e-9))
    return rates[0], rates[1]
