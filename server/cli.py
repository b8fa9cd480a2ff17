"""``quicksilver`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from export.commands import register as register_export
from model.assemble import (
    DEFAULT_ENGINE,
    ENGINES,
    ONNX_ENGINES,
    EngineName,
    engine_adapter,
    engine_model_dir,
    serving_variant,
)
from model.modeldir import is_complete
from model.training.commands import register as register_model_commands

from . import protocol as p
from .runtime import DEFAULT_ASR, RuntimeOptions, load_runtime

log = logging.getLogger("quicksilver")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quicksilver", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the voice WebSocket server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    serve.add_argument(
        "--asr",
        default=DEFAULT_ASR,
        help="Whisper model: tiny.en or base (offline packages), or a CTranslate2 model directory",
    )
    serve.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help="reply model")
    serve.add_argument("--max-reply-tokens", type=int, default=64)
    serve.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where prepared models go (~/.cache/quicksilver)",
    )
    serve.add_argument(
        "--speech-first",
        choices=("auto", "on", "off"),
        default="auto",
        help="pause the reply model while a reply's first sentence is synthesized "
        "(auto: when the reply model runs on the CPU, as Piper does)",
    )
    serve.add_argument(
        "--resume-ttl",
        type=float,
        default=120.0,
        help="seconds a dropped session's conversation is kept for resumption (0: off)",
    )
    serve.set_defaults(run=_serve)
    register_model_commands(sub)
    # Other commands register themselves here: each module's register(sub) adds a
    # subparser with set_defaults(run=function taking the parsed args, returning rc).
    register_export(sub)
    for command in sub.choices.values():
        command.add_argument("--log-level", default="INFO")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    rc: int = args.run(args)
    return rc


def _serve(args: argparse.Namespace) -> int:
    options = RuntimeOptions(
        asr=args.asr,
        engine=args.engine,
        cache_dir=args.cache_dir,
        max_reply_tokens=args.max_reply_tokens,
        speech_first={"auto": None, "on": True, "off": False}[args.speech_first],
    )
    try:
        prepare_model(options.engine, options.cache_dir)
        rt = load_runtime(options)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"quicksilver: cannot load models: {exc}", file=sys.stderr)
        return 1

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(url: str) -> None:
            print(f"Quicksilver listening on {url} (protocol v{p.PROTOCOL_VERSION})", flush=True)

        from .app import ServerConfig, run_until

        config = ServerConfig(resume_ttl_s=args.resume_ttl)
        await run_until(rt, args.host, args.port, stop, ready, config)

    try:
        asyncio.run(run())
    except OSError as exc:
        print(f"quicksilver: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    finally:
        rt.close()
    print("Quicksilver stopped.", flush=True)
    return 0


def prepare_model(engine: EngineName, cache_dir: Path | None) -> None:
    """Build an ONNX engine's model directory on first start (PyTorch, about a minute);
    later starts find it complete and never import torch."""
    if engine not in ONNX_ENGINES:
        return
    variant = serving_variant(engine)
    if not is_complete(engine_model_dir(engine, cache_dir), variant):
        from export.build import ensure_model_dir

        ensure_model_dir(cache_dir, variant, engine_adapter(engine))


if __name__ == "__main__":
    sys.exit(main())
