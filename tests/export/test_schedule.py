"""The host's decoding schedule (model/schedule.py): chosen from measured pass costs,
kept in the model directory, taken by the diffusion loader."""

from __future__ import annotations

import json
from pathlib import Path

from model.batch import host_key
from model.schedule import NARROW, SCHEDULES, TOKENS_PER_PASS, WIDE, Schedule, choose, host_schedule

from .conftest import ort_backend


def test_the_width_whose_tokens_cost_least_is_chosen() -> None:
    # a CPU: a 16-token pass costs 2.7 one-token passes; 0.9 tokens a pass cannot pay it
    assert choose({"1": 12.6, "16": 33.7}) == NARROW
    # a GPU: a wide pass costs what a narrow one does; the served adapter's 0.9 tokens a
    # wide pass still lose to one a narrow pass, an adapter that commits 2.5 wins
    assert choose({"1": 4.0, "16": 4.1}) == NARROW
    assert choose({"1": 4.0, "16": 4.1}, {WIDE: 2.5, NARROW: 0.96}) == WIDE
    # the break-even: a wide pass worth exactly its share of tokens more
    even = 10.0 * TOKENS_PER_PASS[WIDE] / TOKENS_PER_PASS[NARROW]
    assert choose({"1": 10.0, "16": even * 0.99}) == WIDE
    assert choose({"1": 10.0, "16": even * 1.01}) == NARROW


def test_the_schedule_says_why() -> None:
    assert Schedule(1).why() == "blocks of 1, as asked"
    said = Schedule(1, {"1": 9.6, "16": 27.0}).why()
    assert said == "blocks of 1 (16: 30.0 ms a token, 1: 10.0 ms a token)"


def test_the_host_schedule_is_measured_once_and_kept_in_the_model_dir(
    tiny_dir: Path, tmp_path: Path
) -> None:
    single = ort_backend(tiny_dir, "model.int8.onnx")
    schedule, measured = host_schedule(single, tmp_path)
    assert measured and set(schedule.costs_ms) == {"1", "16"}
    assert all(ms > 0 for ms in schedule.costs_ms.values())
    assert schedule.block_size == choose(schedule.costs_ms)
    assert host_schedule(single, tmp_path) == (schedule, False)
    key = host_key(single.session.get_providers())
    kept = json.loads((tmp_path / SCHEDULES).read_text())
    assert kept == {key: {"block_size": schedule.block_size, "costs_ms": schedule.costs_ms}}
    # what is kept is read, not measured again: costs written by hand decide
    kept[key]["costs_ms"] = {"1": 10.0, "16": 5.0}
    (tmp_path / SCHEDULES).write_text(json.dumps(kept))
    assert host_schedule(single, tmp_path)[0].block_size == WIDE


def test_the_diffusion_loader_decodes_in_the_host_s_blocks(tiny_dir: Path, tmp_path: Path) -> None:
    import shutil

    from model.assemble import Batching, load_onnx_diffusion_generator

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_dir, model_dir)
    key = host_key(ort_backend(tiny_dir, "model.int8.onnx").session.get_providers())
    for costs, width in (({"1": 10.0, "16": 40.0}, NARROW), ({"1": 10.0, "16": 5.0}, WIDE)):
        (model_dir / SCHEDULES).write_text(json.dumps({key: {"costs_ms": costs}}))
        gen = load_onnx_diffusion_generator(model_dir, batching=Batching(rows=1))
        assert gen.options.sampler.block_size == width
    asked = load_onnx_diffusion_generator(model_dir, batching=Batching(rows=1, block_size=4))
    assert asked.options.sampler.block_size == 4
