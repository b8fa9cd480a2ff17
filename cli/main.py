"""``quicksilver`` command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NoReturn

from bench.commands import register as register_bench
from bench.spoken import add_arguments as add_spoken_arguments
from bench.spoken import run_command as run_spoken_eval
from export.commands import prepare_model
from export.commands import register as register_export
from model.assemble import (
    DEFAULT_ENGINE,
    ENGINES,
    Batching,
    engine_adapter,
    trained_for_tools,
)
from model.openai_chat import ChatServerOptions
from model.tools import DEFAULT_TOOLS, Tool, parse_tools
from server import auth, fleet, realtime
from server import protocol as p
from server.app import Limits, ServerConfig, run_until
from server.metrics import JsonFormatter
from server.runtime import DEFAULT_ASR, RuntimeOptions, load_runtime
from server.session import SessionConfig
from server.store import check_url as check_store_url
from server.turn_end import EAGERNESS
from training.commands import register as register_model_commands

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# the openai-chat engine's bearer key when --llm-key is not given
LLM_KEY_ENV = "QUICKSILVER_LLM_KEY"
# in a directory of its own, which the server keeps private (0700)
RESUME_FILE = "resume/resumable-sessions.json"

log = logging.getLogger("quicksilver")


class _Parser(argparse.ArgumentParser):
    """Bad option values end in one line naming the option, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def package_version() -> str:
    try:
        return version("quicksilver")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _positive_int(text: str) -> int:
    value = int(text) if text.strip().lstrip("+").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="quicksilver", description=__doc__)
    parser.add_argument("--version", action="version", version=f"quicksilver {package_version()}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser]
    sub = parser.add_subparsers(dest="command", required=True)  # type: ignore[assignment]
    serve = sub.add_parser("serve", help="run the voice WebSocket server")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    serve.add_argument(
        "--asr",
        default=DEFAULT_ASR,
        help="Whisper model: tiny.en or base (offline packages), a CTranslate2 model "
        "directory, or auto (tiny.en on the CPU, base on a GPU)",
    )
    serve.add_argument(
        "--asr-window",
        default="auto",
        choices=("auto", "sized", "full"),
        help="Whisper's encoder window: sized to the turn, or the full 30 s (auto: sized for "
        "an English-only model on the CPU, else full; docs/audio.md)",
    )
    serve.add_argument(
        "--asr-beam",
        type=_positive_int,
        default=RuntimeOptions.asr_beam,
        metavar="N",
        help="hypotheses Whisper's decoder keeps (1: greedy; 5 makes a fifth fewer word errors "
        "for ~12 ms a turn on a 2-core CPU, but ends some sentences early: docs/audio.md)",
    )
    serve.add_argument(
        "--asr-check",
        default=RuntimeOptions.asr_check,
        help="a second Whisper model that hears a turn again before a call on its words is "
        "made without asking: a call whose words it hears otherwise is asked about. auto: "
        "the other offline model (base beside tiny.en, tiny.en beside base); none: act on "
        'the first hearing (docs/actions.md, "Heard twice")',
    )
    serve.add_argument(
        "--asr-batch",
        type=_positive_int,
        default=RuntimeOptions.asr_batch,
        metavar="N",
        help="turns that end together heard in one Whisper call, at most: finals, and second "
        "hearings each (1: each alone); only turns whose windows have one length share a "
        "call, each heard exactly as alone (docs/latency.md)",
    )
    serve.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help="reply model")
    serve.add_argument("--max-reply-tokens", type=int, default=64, help="longest reply, in tokens")
    serve.add_argument(
        "--reply-batch",
        type=int,
        default=None,
        metavar="N",
        help="replies whose steps share one pass of the reply model (default: the batched "
        "graph's 8 where the host's measured pass costs let diffusion blocks share a pass, "
        "as on a GPU, and for the AR engine; else 1, one reply at a time)",
    )
    serve.add_argument(
        "--block-size",
        type=int,
        default=None,
        metavar="N",
        help="the diffusion engine's block width (default: the host's schedule, measured at "
        "first start: 16 where a wide pass costs about a one-token pass, as on a GPU, else "
        "1, next-token decoding of the same model; docs/latency.md)",
    )
    serve.add_argument(
        "--kv-cache-mb",
        type=float,
        default=None,
        metavar="MB",
        help="memory for every reply's and kept conversation's KV cache; a reply past it "
        "gets a turn error (default: room for every live reply and 32 kept conversations)",
    )
    _add_chat_server_arguments(serve)
    serve.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where prepared models and parked conversations go (None: ~/.cache/quicksilver;"
        " conversations are saved across restarts only when it is given)",
    )
    serve.add_argument(
        "--speech-first",
        choices=("auto", "on", "off"),
        default="auto",
        help="pause the reply model while a reply's first sentence is synthesized "
        "(auto: when the reply model runs on the CPU, as Piper does)",
    )
    serve.add_argument(
        "--eagerness",
        choices=tuple(EAGERNESS),
        default="medium",
        help="how soon a paused turn is answered: high answers sooner and cuts in more "
        "often, low waits longer for the user to go on (docs/turn_end.md)",
    )
    serve.add_argument(
        "--tools",
        default="auto",
        metavar="auto|default|none|FILE.json",
        help="the tools a session may call when its start names none: the default device "
        "tools, none, or a JSON list of {name, description, parameters} (docs/protocol.md, "
        "'Actions'); auto: the default ones for openai-chat (the chat server's function "
        "calling) and when the adapter was trained on tool calls (the served one is; "
        "--adapter model/adapters is not), else none. The AR engines call no tools",
    )
    serve.add_argument(
        "--adapter",
        type=Path,
        default=None,
        metavar="DIR",
        help="the diffusion engines' adapter (default: the shipped one, "
        "model/adapters-tools, trained to call tools and to speak; model/adapters is the "
        "chat adapter it continues, which only speaks; docs/actions.md)",
    )
    serve.add_argument(
        "--turn-end",
        choices=("model", "words"),
        default="model",
        help="what ends a paused turn besides silence: the reply model's score of the "
        "transcript and its last word, or the last word only",
    )
    serve.add_argument(
        "--resume-ttl",
        type=float,
        default=120.0,
        help="seconds a dropped session's conversation is kept for resumption (0: off)",
    )
    serve.add_argument(
        "--store",
        default="memory",
        help="where dropped sessions' conversations are kept: memory (this process) or "
        "redis://HOST:PORT/DB, shared by the nodes of a fleet (docs/security.md)",
    )
    serve.add_argument(
        "--node-id",
        default="",
        help="this node's name in the fleet's registry (default: hostname:port)",
    )
    limits = Limits()
    serve.add_argument(
        "--max-sessions", type=int, default=limits.max_sessions, help="open sessions at once"
    )
    serve.add_argument(
        "--max-sessions-per-address",
        type=int,
        default=limits.max_sessions_per_address,
        help="open sessions from one client address",
    )
    serve.add_argument(
        "--max-sessions-per-key",
        type=int,
        default=limits.max_sessions_per_key,
        help="with API keys: open sessions of one key, across the fleet with --store (0: no "
        "limit of its own)",
    )
    serve.add_argument(
        "--text-per-minute-per-key",
        type=int,
        default=limits.text_per_minute_per_key,
        help="with API keys: text messages a minute of one key's sessions together, across "
        "the fleet with --store (0: only each session's own rate)",
    )
    serve.add_argument(
        "--max-session-minutes",
        type=float,
        default=limits.max_session_s / 60,
        help="a session is closed after this long (its resume token continues it)",
    )
    serve.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="server log lines"
    )
    serve.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda", "tensorrt"),
        default="auto",
        help="where ASR, TTS and the reply model run (auto: a GPU when onnxruntime-gpu and "
        "CTranslate2 see one; tensorrt: the reply model through TensorRT)",
    )
    auth.add_serve_arguments(serve)
    serve.set_defaults(run=_serve)
    register_model_commands(sub)
    _add_spoken_eval(sub)
    # Other commands register themselves here: each module's register(sub) adds a
    # subparser with set_defaults(run=function taking the parsed args, returning rc).
    register_export(sub)
    register_bench(sub)
    auth.register(sub)
    fleet.register(sub)
    for command in sub.choices.values():
        command.formatter_class = argparse.ArgumentDefaultsHelpFormatter
        command.add_argument(
            "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="log detail"
        )
    return parser


def _add_spoken_eval(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``eval actions --spoken``: the held-out lines spoken through a real server
    (bench/spoken.py; training/, where the typed eval lives, may not reach a server)."""
    actions = _subcommand(_subcommand(sub, "eval"), "actions")
    add_spoken_arguments(actions)
    typed = actions.get_default("run")

    def run(args: argparse.Namespace) -> int:
        return run_spoken_eval(args) if args.spoken else int(typed(args))

    actions.set_defaults(run=run)


def _subcommand(
    parent: argparse.ArgumentParser | argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
) -> argparse.ArgumentParser:
    if isinstance(parent, argparse._SubParsersAction):
        return parent.choices[name]
    sub = next(a for a in parent._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices[name]
    return parser


def _add_chat_server_arguments(serve: argparse.ArgumentParser) -> None:
    """The server that ``--engine openai-chat`` asks (docs/realtime.md, "A bigger reply
    model")."""
    chat = ChatServerOptions(url="", model="")
    serve.add_argument(
        "--llm-url",
        default=None,
        help="openai-chat: the OpenAI-compatible API's base URL, to which /chat/completions "
        "is added (e.g. http://127.0.0.1:8000/v1)",
    )
    serve.add_argument("--llm-model", default=None, help="openai-chat: the server's model name")
    serve.add_argument(
        "--llm-key",
        default=None,
        help=f"openai-chat: the API key sent as a bearer token (None: ${LLM_KEY_ENV}, "
        "which keeps it out of the process list)",
    )
    serve.add_argument(
        "--llm-connect-timeout",
        type=float,
        default=chat.connect_timeout_s,
        help="openai-chat: seconds to connect to the server before the turn fails",
    )
    serve.add_argument(
        "--llm-first-token-timeout",
        type=float,
        default=chat.first_token_timeout_s,
        help="openai-chat: seconds to wait for a reply's first piece, and for each next one, "
        "before the turn fails",
    )
    serve.add_argument(
        "--llm-tool-choice",
        default=chat.tool_choice,
        metavar="auto|required|none|TOOL",
        help="openai-chat: OpenAI's tool_choice; a tool's name forces that call on every turn "
        "(llama-cpp-python's server streams only a forced call)",
    )


def chat_server_options(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> ChatServerOptions | None:
    """The openai-chat engine's server, None for the other engines; ValueError when the
    engine and the --llm-* options do not go together."""
    if args.engine != "openai-chat":
        if args.llm_url is not None or args.llm_model is not None:
            raise ValueError("--llm-url and --llm-model are for --engine openai-chat")
        return None
    if not args.llm_url or not args.llm_model:
        raise ValueError("--engine openai-chat needs --llm-url and --llm-model")
    if args.llm_connect_timeout <= 0 or args.llm_first_token_timeout <= 0:
        raise ValueError("the --llm-*-timeout options must be positive")
    return ChatServerOptions(
        url=args.llm_url,
        model=args.llm_model,
        api_key=args.llm_key or environ.get(LLM_KEY_ENV) or None,
        connect_timeout_s=args.llm_connect_timeout,
        first_token_timeout_s=args.llm_first_token_timeout,
        tool_choice=args.llm_tool_choice,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "text") == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[handler])
    rc: int = args.run(args)
    return rc


def _tools(spec: str, auto: bool) -> tuple[Tool, ...]:
    if spec == "default" or (spec == "auto" and auto):
        return DEFAULT_TOOLS
    if spec == "auto":
        return ()
    if spec == "none":
        return ()
    return parse_tools(json.loads(Path(spec).read_text()))


def _serve(args: argparse.Namespace) -> int:
    try:
        auth_config = auth.config_from_args(args, os.environ)
        tls = auth.tls_context(args.tls_cert, args.tls_key)
        chat = chat_server_options(args, os.environ)
        store = check_store_url(args.store)
    except (auth.AuthError, ValueError) as exc:
        print(f"quicksilver: {exc}", file=sys.stderr)
        return 2
    if (refusal := auth.check_bind(args.host, auth_config)) is not None:
        print(refusal, file=sys.stderr)
        return 2
    try:
        auto = args.engine == "openai-chat" or trained_for_tools(
            engine_adapter(args.engine, args.adapter)
        )
        tools = _tools(args.tools, auto)
    except (OSError, ValueError) as exc:
        print(f"quicksilver: --tools: {exc}", file=sys.stderr)
        return 2
    config = ServerConfig(
        session=SessionConfig(eagerness=args.eagerness, tools=tools),
        resume_ttl_s=args.resume_ttl,
        limits=dataclasses.replace(
            Limits(),
            max_sessions=args.max_sessions,
            max_sessions_per_address=args.max_sessions_per_address,
            max_sessions_per_key=args.max_sessions_per_key,
            text_per_minute_per_key=args.text_per_minute_per_key,
            max_session_s=args.max_session_minutes * 60,
        ),
        resume_file=args.cache_dir / RESUME_FILE if args.cache_dir is not None else None,
        auth=auth_config,
        tls=tls,
        store=store,
        node_id=args.node_id,
    )
    options = RuntimeOptions(
        asr=args.asr,
        asr_window=args.asr_window,
        asr_beam=args.asr_beam,
        asr_check=args.asr_check,
        asr_batch=args.asr_batch,
        engine=args.engine,
        cache_dir=args.cache_dir,
        max_reply_tokens=args.max_reply_tokens,
        speech_first={"auto": None, "on": True, "off": False}[args.speech_first],
        device=args.device,
        turn_model=args.turn_end == "model",
        chat=chat,
        adapter=args.adapter,
        batching=Batching(args.reply_batch, args.kv_cache_mb, args.block_size),
    )
    try:
        prepare_model(options.engine, options.cache_dir, options.device, options.adapter)
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
            print(f"OpenAI Realtime (GA) on {url.removesuffix(p.PATH)}{realtime.PATH}", flush=True)

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
