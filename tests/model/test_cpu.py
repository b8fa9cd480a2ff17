"""The processor as every kernel choice and benchmark reads it (model/cpu.py)."""

from __future__ import annotations

import platform
from pathlib import Path

from model.cpu import read_cpu

TWO = (
    "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\n"
    "processor\t: 1\nmodel name\t: AMD EPYC 9004\nflags\t\t: fpu avx2 fma avx512f\n"
)


def test_the_first_processor_s_name_and_flags_are_read(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(TWO)
    cpu = read_cpu(info)
    assert cpu.name == "AMD EPYC" and cpu.flags == {"fpu", "avx2", "fma"}


def test_a_cpuinfo_without_them_names_the_machine_type(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # as an ARM VM writes it
    assert read_cpu(info).name == (platform.machine() or "unknown")
    assert read_cpu(info).flags is None
    assert read_cpu(tmp_path / "missing").flags is None  # not Linux
