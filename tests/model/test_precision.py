"""bf16 only where it is fast: the CPU's flags decide (training.precision)."""

from pathlib import Path

import pytest
import torch

from training.precision import bf16_is_fast, cpu_flags, working_dtype

AVX2 = {"fpu", "sse2", "avx", "avx2", "fma"}
SAPPHIRE = AVX2 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
CPU = torch.device("cpu")


def test_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\nbogomips\t: 4000\n")
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") is None


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux only")
def test_this_machine_has_flags() -> None:
    flags = cpu_flags()
    assert flags is not None and "fpu" in flags


def test_bf16_is_slow_only_on_a_cpu_without_bf16_units() -> None:
    assert not bf16_is_fast(CPU, AVX2)
    assert bf16_is_fast(CPU, SAPPHIRE)
    assert bf16_is_fast(CPU, AVX2 | {"avx512_bf16"})
    assert bf16_is_fast(torch.device("cuda"), AVX2)  # the GPU does the products
    assert bf16_is_fast(CPU, set()) is False


def test_unreadable_flags_are_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    import training.precision as precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: None)
    assert precision.bf16_is_fast(CPU)


def test_working_dtype_falls_back_to_fp32_and_says_so() -> None:
    said: list[str] = []
    assert working_dtype("bfloat16", CPU, said.append, AVX2) == "float32"
    assert len(said) == 1 and "fp32 runs instead" in said[0]
    assert working_dtype("bfloat16", CPU, said.append, SAPPHIRE) == "bfloat16"
    assert working_dtype("float32", CPU, said.append, AVX2) == "float32"
    assert len(said) == 1  # nothing to say when nothing changes
