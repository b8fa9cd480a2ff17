from __future__ import annotations

import threading
from pathlib import Path

import pytest

from audio import assets
from audio.assets import ModelNotFoundError


def test_missing_package_error_names_it() -> None:
    with pytest.raises(ModelNotFoundError, match="no_such_model_pkg"):
        assets.package_dir("no_such_model_pkg")


def test_other_names_pass_through_or_use_the_directory(tmp_path: Path) -> None:
    assert assets.whisper_model("large-v3") == "large-v3"  # a hub name, untouched
    assert assets.whisper_model(str(tmp_path)) == str(tmp_path)


@pytest.mark.models
def test_bundled_files_are_found() -> None:
    assert assets.silero_vad_path().name == "silero_vad_v6.onnx"
    voice = assets.piper_voice_paths()
    assert voice.model.is_file()
    assert voice.config.name == "en_US-joe-medium.onnx.json"
    assert (Path(assets.whisper_model("tiny.en")) / "model.bin").is_file()


@pytest.mark.models
def test_whisper_base_is_joined_once_atomically_even_when_racing(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def join() -> None:
        try:
            results.append(assets.whisper_base_dir(tmp_path))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=join) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    final = tmp_path / assets.WHISPER_BASE_DIRNAME
    assert results == [final, final]
    parts = [assets.package_dir(m) / "data" for m in assets.WHISPER_BASE_PACKAGES]
    size = (parts[0] / "model.bin.part1").stat().st_size
    size += (parts[1] / "model.bin.part2").stat().st_size
    assert (final / "model.bin").stat().st_size == size
    assert sorted(p.name for p in final.iterdir()) == [
        "config.json",
        "model.bin",
        "tokenizer.json",
        "vocabulary.txt",
    ]
    assert [p.name for p in tmp_path.iterdir()] == [final.name]  # no temp dirs left

    mtime = (final / "model.bin").stat().st_mtime_ns
    assert assets.whisper_model("base", tmp_path) == str(final)
    assert (final / "model.bin").stat().st_mtime_ns == mtime  # reused, not rewritten


@pytest.mark.models
def test_truncated_join_is_rebuilt(tmp_path: Path) -> None:
    final = assets.whisper_base_dir(tmp_path)
    with (final / "model.bin").open("r+b") as f:
        f.truncate(1000)
    assert assets.whisper_base_dir(tmp_path) == final
    assert (final / "model.bin").stat().st_size > 100_000_000
