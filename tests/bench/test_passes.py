"""``quicksilver bench passes`` (bench/passes.py) on the tiny model's graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.passes import time_passes
from cli.main import main


def test_every_file_width_and_cache_length_gets_a_median(tiny_dir: Path) -> None:
    files = {"int8": tiny_dir / "model.int8.onnx", "fp32": tiny_dir / "model.onnx"}
    rows = time_passes(files, widths=(1, 4), cached=(3, 9), repeats=3)
    assert [(r["file"], r["P"], r["T"]) for r in rows] == [
        (f, P, T) for P in (3, 9) for T in (1, 4) for f in ("int8", "fp32")
    ]
    # each cost over the one-token pass of the same graph at the same cache length
    one = {(r["file"], r["P"]): r["ms"] for r in rows if r["T"] == 1}
    for r in rows:
        assert r["ratio"] == r["ms"] / one[r["file"], r["P"]]
        assert r["ratio"] == 1.0 or r["T"] != 1


def test_the_command_times_named_graphs_and_refuses_missing_ones(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "passes.json"
    args = ["bench", "passes", "--model-dir", str(tiny_dir), "--onnx", str(tiny_dir / "model.onnx")]
    assert (
        main([*args, "--widths", "2", "--cached", "4", "--repeats", "2", "--json", str(out)]) == 0
    )
    report = json.loads(out.read_text())
    assert set(report["files"]) == {"model.int8.onnx", "model.onnx"}
    assert {(r["P"], r["T"]) for r in report["rows"]} == {(4, 1), (4, 2)}  # T = 1 added
    assert "(1.00x)" in capsys.readouterr().out
    assert main(["bench", "passes", "--onnx", str(tmp_path / "nothing.onnx")]) == 1
    assert "no step graph at" in capsys.readouterr().err
