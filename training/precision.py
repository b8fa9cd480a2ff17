"""bf16 only where PyTorch multiplies it fast.

PyTorch runs bf16 matrix products through oneDNN on a GPU and on CPUs with AVX512_BF16
or AMX; on a CPU without them (AVX2 only) it falls back to a scalar kernel. Measured on
a 2-core AMD EPYC (AVX2), one thread, 512x576 @ 576x1536: fp32 17.9 ms, bf16 763 ms.
Training, replying and scoring in bf16 there take tens of times longer than in fp32,
so where bf16 is asked for and slow, fp32 runs instead and the log says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from model.cpu import CPUINFO, read_cpu

_FAST_BF16_FLAGS = {"avx512_bf16", "amx_bf16"}
_CPU = torch.device("cpu")


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """The CPU's feature flags (Linux), or None where they cannot be read."""
    flags = read_cpu(cpuinfo).flags
    return None if flags is None else set(flags)


def bf16_is_fast(device: torch.device, flags: set[str] | None = None) -> bool:
    """Whether bf16 products run at full speed on ``device``. A CPU whose flags cannot be
    read is trusted (no second-guessing a platform this does not know)."""
    if device.type != "cpu":
        return True
    flags = cpu_flags() if flags is None else flags
    return flags is None or bool(_FAST_BF16_FLAGS & flags)


def working_dtype(
    asked: str,
    device: torch.device = _CPU,
    log: Callable[[str], None] = print,
    flags: set[str] | None = None,
) -> str:
    """``asked`` ("bfloat16" or "float32"), or "float32" where bf16 would be slow."""
    if asked != "bfloat16" or bf16_is_fast(device, flags):
        return asked
    log(
        "bf16 asked for, but this CPU has no AVX512_BF16 or AMX: PyTorch's bf16 products "
        "run tens of times slower than fp32 here, so fp32 runs instead"
    )
    return "float32"
