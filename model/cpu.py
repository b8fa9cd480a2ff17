"""What this processor is: its name and feature flags, from ``/proc/cpuinfo``.

Kernel choices (``model.batch.host_key``: which int8 kernel and schedule a host keeps),
bf16 training (``training.precision``) and the figures a benchmark writes beside its
results all read the same two lines; torch-free, so the serving path can read them.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class Cpu:
    name: str  # "model name": "AMD EPYC", "Intel(R) Xeon(R) ..."; the machine type elsewhere
    flags: frozenset[str] | None  # None where they cannot be read (not Linux)


def read_cpu(cpuinfo: Path = CPUINFO) -> Cpu:
    """The first processor's name and flags (every core of a VM reports the same)."""
    fallback = platform.machine() or "unknown"
    try:
        text = cpuinfo.read_text()
    except OSError:
        return Cpu(fallback, None)
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = fields.get("flags")
    return Cpu(
        fields.get("model name", fallback), None if flags is None else frozenset(flags.split())
    )
