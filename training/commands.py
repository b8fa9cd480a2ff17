"""``quicksilver data``, ``quicksilver train``, ``quicksilver eval llm``, ``quicksilver
eval actions``, ``quicksilver eval sessions`` and ``quicksilver router``.

Registered in cli/main.py; torch and the model code are imported only when a command
runs, so ``quicksilver serve`` never pays for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model.router import ToolRouter
    from model.spans import SpanPointer


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    data = sub.add_parser("data", help="regenerate the self-distillation corpus from a seed")
    data.add_argument("--seed", type=int, default=1234)
    data.add_argument("--n", type=int, default=400, help="training questions")
    data.add_argument("--out", type=Path, default=Path("data/distill"))
    data.add_argument("--max-reply-tokens", type=int, default=64)
    data.add_argument("--batch", type=int, default=20, help="questions decoded together")
    data.add_argument("--model-share", type=float, default=0.15)
    data.add_argument("--train-dtype", default="float32", choices=("float32", "bfloat16"))
    data.add_argument("--threads", type=int, default=2)
    data.add_argument(
        "--device",
        default="cpu",
        help="where SmolLM2 writes the replies: cpu, cuda, cuda:N or auto (not with "
        "--own-replies, which runs the exported graph)",
    )
    data.add_argument(
        "--own-replies",
        type=Path,
        default=None,
        metavar="MODEL_DIR",
        help="instead: the exported diffusion model's own replies to --limit training "
        "questions of --source (docs/results/2026-12-certainty-forcing.md)",
    )
    data.add_argument(
        "--actions",
        action="store_true",
        help="instead: the tool-call corpus (commands with their calls, hard negatives, the "
        "--source chat), into --out (docs/training.md, 'Tool calls')",
    )
    data.add_argument("--commands", type=int, default=2000, help="with --actions")
    data.add_argument("--negatives", type=int, default=400, help="with --actions")
    data.add_argument("--source", type=Path, default=Path("data/distill"))
    data.add_argument("--limit", type=int, default=500)
    data.set_defaults(run=_data)

    train = sub.add_parser("train", help="train the block-diffusion adapter")
    train.add_argument("--data", type=Path, default=Path("data/distill"))
    train.add_argument("--out", type=Path, default=Path("runs/adapter"))
    train.add_argument("--ship", type=Path, default=None, help="also save the adapter here")
    train.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="TrainConfig field"
    )
    train.set_defaults(run=_train)

    ev = sub.add_parser("eval", help="measure a reply model's quality")
    ev_sub = ev.add_subparsers(dest="what", required=True)
    llm = ev_sub.add_parser("llm", help="diffusion replies against the autoregressive baseline")
    llm.add_argument("--prompts", type=Path, default=None, help="one question per line")
    llm.add_argument("--data", type=Path, default=Path("data/distill"))
    source = llm.add_mutually_exclusive_group()  # an exported directory has its adapter merged
    source.add_argument("--adapter", type=Path, default=None, help="default: the served one")
    llm.add_argument("--json", type=Path, required=True, dest="json_out")
    llm.add_argument("--limit", type=int, default=None, help="first N prompts only")
    llm.add_argument("--max-tokens", type=int, default=64)
    llm.add_argument("--threshold", type=float, action="append", default=None)
    llm.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="decode in blocks of N (default: the engines' 16); blocks of 1 end replies as "
        "serve's narrow schedule does (--end-bar 0.05, --wrap-after 40, unless given)",
    )
    llm.add_argument("--steps-per-block", type=int, default=None)
    source.add_argument(
        "--onnx", type=Path, default=None, help="exported model dir: diffusion replies in ONNX"
    )
    llm.add_argument(
        "--onnx-variant",
        default="int8",
        choices=("int8", "fp32", "fp16"),
        help="which graph of the --onnx directory (default: int8)",
    )
    llm.add_argument(
        "--fallback",
        action="append",
        choices=("confident", "leftmost"),
        help="the threshold rule's forced commit (repeatable; default: the engines')",
    )
    llm.add_argument(
        "--end-lookahead",
        action="append",
        type=_lookahead,
        help="masked positions an end token may commit behind: N or 'any' (repeatable; "
        "default: the engines')",
    )
    llm.add_argument(
        "--sentence-end",
        action="append",
        choices=("on", "off"),
        help="a reply ends only after a sentence's end (on) or anywhere (off); repeatable "
        "(default: the engines')",
    )
    llm.add_argument(
        "--stop-repeats",
        action="append",
        choices=("on", "off"),
        help="a reply ends before a sentence that repeats its earlier ones (on) or not "
        "(off); repeatable (default: the engines', on)",
    )
    llm.add_argument(
        "--end-bar",
        action="append",
        type=float,
        help="an end token is proposed where the end's probability reaches this; "
        "repeatable (default: the engines')",
    )
    llm.add_argument(
        "--wrap-after",
        action="append",
        type=int,
        help="a reply this many tokens long ends at its next sentence's end; repeatable "
        "(default: the engines')",
    )
    llm.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    llm.add_argument(
        "--history", type=int, default=0, help="earlier turns before each question (default 0)"
    )
    llm.add_argument(
        "--opening-ban",
        type=int,
        default=None,
        help="tokens of an earlier reply's (or the question's) opening a diffusion reply may "
        "not repeat (0: off; default: the engines')",
    )
    llm.add_argument(
        "--tools",
        default="none",
        choices=("none", "default"),
        help="the diffusion model's system prompt lists no tools (default) or the default "
        "device tools, as a session that names none gets",
    )
    llm.add_argument("--seed", type=int, default=0)
    llm.add_argument("--threads", type=int, default=2)
    llm.set_defaults(run=_eval_llm)
    llm.add_argument("--log-level", default="INFO")  # cli/main.py adds it to top-level ones

    acts = _held_out_parser(
        ev_sub, "actions", "tool calls of the served engine on held-out commands and chat"
    )
    acts.add_argument("--onnx", type=Path, default=None, help="default: the served model")
    acts.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="divide the call's branches by their content-free odds (docs/actions.md)",
    )
    acts.add_argument(
        "--spans",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="string values from the adapter's span pointers where it has them "
        "(model/spans.py); --no-spans: the model writes them",
    )
    acts.add_argument(
        "--tool-set",
        # training.eval_actions.TOOL_SETS, not imported while the parser is built
        choices=("default", "own", "without"),
        default="default",
        help="the session's tools: the default set; each command's own tool alone; or the "
        "set less each command's tool, where a call is wrong (docs/actions.md)",
    )
    acts.set_defaults(run=_eval_actions)

    calls = _held_out_parser(
        ev_sub, "calls", "tool calls on the held-out commands and chat, plain diffusion sampler"
    )
    model = calls.add_mutually_exclusive_group()
    model.add_argument("--onnx", type=Path, default=None, help="exported model dir (as served)")
    model.add_argument("--adapter", type=Path, default=None, help="else PyTorch + this adapter")
    calls.set_defaults(run=_eval_calls)

    _register_sessions(ev_sub)

    router = _fit_parser(sub, "router", "fit the tool router of a tools adapter (model/router.py)")
    router.add_argument(
        "--l2",
        type=float,
        default=None,
        help="one L2 for every classifier (default: each chosen on the development split)",
    )
    router.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="ROUTER",
        help="keep this router file's state classifiers and fit only its word expert "
        "(on the development split; a few minutes instead of a refit's ~15)",
    )
    router.set_defaults(run=_router)
    spans = _fit_parser(
        sub, "spans", "fit the span pointers of a tools adapter's string values (model/spans.py)"
    )
    spans.set_defaults(run=_spans)


def _fit_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse.ArgumentParser:
    """A command that fits something over a tools adapter's prefills, to
    ``model/adapters-tools/<name>.npz``."""
    fit = sub.add_parser(name, help=help)
    fit.add_argument(
        "--onnx",
        type=Path,
        default=None,
        help="the exported model it reads (default: model/adapters-tools' directory, "
        "built on first use)",
    )
    fit.add_argument("--data", type=Path, default=Path("data/actions"))
    fit.add_argument(
        "--out", type=Path, default=Path(f"model/adapters-tools/{name}.npz"), help="the file"
    )
    fit.add_argument(
        "--with-history", type=float, default=0.5, help="share of rows asked after others"
    )
    fit.add_argument("--threads", type=int, default=2)
    fit.add_argument(
        "--rows",
        action="store_true",
        help="read the directory's rows graphs (export --rows-graphs), for "
        f"model/adapters-tools/rows/{name}.npz (docs/export.md)",
    )
    return fit


def _held_out_parser(
    ev_sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse.ArgumentParser:
    """The options of the two evals of ``quicksilver data --actions``'s held-out split."""
    ev = ev_sub.add_parser(name, help=help)
    ev.add_argument("--data", type=Path, default=Path("data/actions"))
    ev.add_argument("--onnx-variant", default="int8", choices=("int8", "fp32", "fp16"))
    ev.add_argument("--per-tool", type=int, default=None, help="first N commands per tool")
    ev.add_argument("--chat-limit", type=int, default=None, help="first N chat questions")
    ev.add_argument("--max-tokens", type=int, default=64)
    ev.add_argument("--threads", type=int, default=2)
    ev.add_argument("--json", type=Path, required=True, dest="json_out")
    ev.add_argument("--log-level", default="INFO")
    return ev


def _write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def _register_sessions(ev_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ses = ev_sub.add_parser("sessions", help="20-turn scripted sessions on their own replies")
    ses.add_argument(
        "--engine",
        action="append",
        default=None,
        help="a reply engine (repeatable; default: diffusion-onnx and smollm2-ar-onnx)",
    )
    ses.add_argument("--scripts", type=Path, default=None, help="JSON: session -> user turns")
    ses.add_argument(
        "--calls",
        type=Path,
        default=None,
        help="JSON: a command's words -> its expected call {name, arguments} (default: the "
        "shipped scripts' commands); the other turns are chat",
    )
    ses.add_argument("--turns", type=int, default=None, help="first N turns of each session")
    ses.add_argument("--max-tokens", type=int, default=64)
    ses.add_argument(
        "--history-window",
        type=_window,
        default=None,
        help="earlier messages in each prompt: N or 'all' (default: the engines')",
    )
    ses.add_argument(
        "--opening-ban",
        type=int,
        default=None,
        help="tokens of an earlier reply's opening a reply may not repeat (0: off; "
        "default: the engines')",
    )
    ses.add_argument(
        "--stop-repeats",
        choices=("on", "off"),
        default=None,
        help="the diffusion engines end a reply before a sentence that repeats it "
        "(default: the engines', on)",
    )
    ses.add_argument(
        "--tools",
        choices=("none", "default"),
        default="default",
        help="the session's tools: the default device tools, as a served session that "
        "names none gets (the diffusion engines act), or none",
    )
    ses.add_argument("--adapter", type=Path, default=None, help="the diffusion engines' adapter")
    ses.add_argument("--no-quality", action="store_true", help="skip NLL and similarity")
    ses.add_argument(
        "--references", type=Path, default=None, help="reuse the AR references of a --json report"
    )
    ses.add_argument("--json", type=Path, default=None, dest="json_out")
    ses.add_argument("--threads", type=int, default=2)
    ses.add_argument("--log-level", default="INFO")
    ses.set_defaults(run=_eval_sessions)


def _lookahead(text: str) -> int | None:
    if text == "any":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count >= 0 or 'any', not {text!r}")
    return int(text)


def _window(text: str) -> int | str:
    if text == "all":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count >= 0 or 'all', not {text!r}")
    return int(text)


def _data(args: argparse.Namespace) -> int:
    import torch

    from model.nn.gguf import load_smollm2, open_gguf
    from model.tokenizer import Tokenizer
    from training.actions import ActionsConfig, make_actions
    from training.data import DataConfig, make_dataset
    from training.precision import working_dtype
    from training.train import train_device

    torch.set_num_threads(args.threads)
    if args.actions and args.own_replies:
        print("quicksilver data: --actions and --own-replies are two corpora", file=sys.stderr)
        return 2
    if args.own_replies:
        if args.device != "cpu":
            print(
                "quicksilver data: --own-replies runs the exported graph on the CPU; "
                "leave out --device",
                file=sys.stderr,
            )
            return 2
        return _own_replies(args)
    try:  # before the model loads: a missing GPU fails at once
        device = train_device(args.device, option="--device ")
    except ValueError as exc:
        print(f"quicksilver data: {exc}", file=sys.stderr)
        return 2
    # before the recipe is written: it names the dtype the replies were written in
    args.train_dtype = working_dtype(args.train_dtype, device, log=_log)
    f = open_gguf()
    model, tok = load_smollm2(f), Tokenizer(f.tokenizer_data())
    cfg = DataConfig(
        seed=args.seed,
        n=args.n,
        model_share=args.model_share,
        max_reply_tokens=args.max_reply_tokens,
        batch=args.batch,
        train_dtype=args.train_dtype,
        device=str(device),
    )
    if args.actions:
        actions = ActionsConfig(seed=args.seed, commands=args.commands, negatives=args.negatives)
        command = (
            f"quicksilver data --actions --seed {args.seed} --commands {args.commands} "
            f"--negatives {args.negatives} --batch {args.batch} --train-dtype {args.train_dtype} "
            f"--source {args.source} --out {args.out}"
            + (f" --device {device}" if device.type != "cpu" else "")
        )
        recipe = make_actions(model, tok, actions, args.source, args.out, cfg, _log, command)
    else:
        recipe = make_dataset(model, tok, cfg, args.out, log=_log)
    print(json.dumps(recipe, indent=2))
    return 0


def _own_replies(args: argparse.Namespace) -> int:
    from model.assemble import load_onnx_backend
    from model.nn.gguf import gguf_tokenizer
    from model.runtime import RuntimeConfig
    from model.sampler import SamplerSettings
    from training.data import PROMPT_BUDGET, own_replies, reply_budget

    # the replies are decoded to the source corpus's budget, in whole blocks
    max_len = PROMPT_BUDGET + SamplerSettings().blocks(reply_budget(args.source))[-1][1]
    cfg = RuntimeConfig(max_len=max_len, threads=args.threads)
    backend = load_onnx_backend(args.own_replies, "int8", cfg)
    teacher = f"{args.own_replies} int8"
    tok = gguf_tokenizer()
    recipe = own_replies(backend, teacher, tok, args.source, args.out, args.limit, args.seed, _log)
    print(json.dumps(recipe, indent=2))
    return 0


def _train(args: argparse.Namespace) -> int:
    from training.train import TrainConfig, parse_overrides, run_training, train_device

    try:
        cfg = parse_overrides(TrainConfig(data=str(args.data), out=str(args.out)), args.set)
        train_device(cfg.device)  # before the model loads: a missing GPU fails at once
    except ValueError as exc:
        print(f"quicksilver train: {exc}", file=sys.stderr)
        return 2
    try:
        run_training(cfg, ship=args.ship)
    except FileNotFoundError as exc:  # the base GGUF, the data folder, an init adapter
        print(f"quicksilver train: {exc}", file=sys.stderr)
        return 1
    return 0


def _eval_llm(args: argparse.Namespace) -> int:
    from training.actions import TOOLS_SYSTEM_PROMPT
    from training.eval import EvalOptions, run_eval

    opts = EvalOptions(
        prompts=args.prompts,
        data=args.data,
        adapter=args.adapter,
        limit=args.limit,
        max_tokens=args.max_tokens,
        thresholds=tuple(args.threshold or ()),
        block_size=args.block_size,
        steps_per_block=args.steps_per_block,
        fallbacks=tuple(args.fallback or ()),
        end_lookaheads=tuple(args.end_lookahead or ()),
        sentence_ends=tuple(v == "on" for v in args.sentence_end or ()),
        stop_repeats=tuple(v == "on" for v in args.stop_repeats or ()),
        end_bars=tuple(args.end_bar or ()),
        wrap_afters=tuple(args.wrap_after or ()),
        onnx=args.onnx,
        onnx_variant=args.onnx_variant,
        history=args.history,
        opening_ban=args.opening_ban,
        system=TOOLS_SYSTEM_PROMPT if args.tools == "default" else "",
        dtype=args.dtype,
        seed=args.seed,
        threads=args.threads,
    )
    try:
        report = run_eval(opts, log=_log)
    except FileNotFoundError as exc:  # a prompts file, model directory or graph missing
        print(f"quicksilver eval: {exc}", file=sys.stderr)
        return 2
    _write_report(args.json_out, report)
    print(json.dumps(report["summary"], indent=2))
    return 0


def _eval_sessions(args: argparse.Namespace) -> int:
    from training.sessions import (
        CALLS_FILE,
        SCRIPTS_FILE,
        SessionOptions,
        run_sessions,
        table,
    )

    window = args.history_window  # None: the engines'; "all": no window
    opts = SessionOptions(
        scripts=args.scripts or SCRIPTS_FILE,
        calls=args.calls or CALLS_FILE,
        engines=tuple(args.engine or SessionOptions().engines),
        turns=args.turns,
        max_tokens=args.max_tokens,
        history_window=None if window == "all" else window,
        full_history=window == "all",
        opening_ban=args.opening_ban,
        stop_repeats=None if args.stop_repeats is None else args.stop_repeats == "on",
        quality=not args.no_quality,
        references=args.references,
        tools=args.tools == "default",
        adapter=args.adapter,
        threads=args.threads,
    )
    try:
        report = run_sessions(opts, log=_log)
    except (FileNotFoundError, ValueError) as exc:  # a scripts file, a model, an engine
        print(f"quicksilver eval: {exc}", file=sys.stderr)
        return 2
    if args.json_out:
        _write_report(args.json_out, report)
    print(table(report))
    return 0


def _tools_model_dir(given: Path | None) -> Path:
    """``--onnx``, or the directory of model/adapters-tools (built on first use)."""
    if given is not None:
        return given
    from export.build import ensure_model_dir

    return ensure_model_dir(None, "int8", Path("model/adapters-tools"))


def _spans(args: argparse.Namespace) -> int:
    from model.spans import SPANS_FILE
    from training.spans import SpanOptions, train_spans

    def train(model_dir: Path) -> SpanPointer:
        options = SpanOptions(
            model_dir,
            args.data,
            threads=args.threads,
            with_history=args.with_history,
            rows=args.rows,
        )
        return train_spans(options, log=_log)

    return _fit(args, "spans", SPANS_FILE, train)


def _router(args: argparse.Namespace) -> int:
    from model.router import ROUTER_FILE
    from training.router import RouterOptions, train_router

    def train(model_dir: Path) -> ToolRouter:
        options = RouterOptions(
            model_dir,
            args.data,
            l2=args.l2,
            threads=args.threads,
            with_history=args.with_history,
            keep=args.keep,
            rows=args.rows,
        )
        return train_router(options, log=_log)

    return _fit(args, "router", ROUTER_FILE, train)


def _fit(
    args: argparse.Namespace,
    command: str,
    file: str,
    train: Callable[[Path], ToolRouter | SpanPointer],
) -> int:
    """Fit over the tools adapter's model directory (``--onnx``) and write ``--out``,
    which must be named ``file`` (the name the engine looks for)."""
    if args.out.name != file:
        print(f"quicksilver {command}: --out must be named {file}", file=sys.stderr)
        return 2
    model_dir = _tools_model_dir(args.onnx)
    try:
        fitted = train(model_dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"quicksilver {command}: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fitted.save(args.out)
    print(json.dumps(fitted.info, indent=2))
    print(f"wrote {args.out}")
    return 0


def _eval_actions(args: argparse.Namespace) -> int:
    from training.eval_actions import ActionsEvalOptions, run_actions_eval

    opts = ActionsEvalOptions(
        data=args.data,
        onnx=args.onnx,
        onnx_variant=args.onnx_variant,
        per_tool=args.per_tool,
        chat_limit=args.chat_limit,
        max_tokens=args.max_tokens,
        threads=args.threads,
        calibrate=args.calibrate,
        spans=args.spans,
        tool_set=args.tool_set,
    )
    try:
        report = run_actions_eval(opts, log=_log)
    except FileNotFoundError as exc:  # the held-out files or the model directory
        print(f"quicksilver eval actions: {exc}", file=sys.stderr)
        return 2
    _write_report(args.json_out, report)
    summary = {k: v for k, v in report["summary"].items() if k != "per_tool"}
    print(json.dumps(summary, indent=2))
    print(actions_table(report["summary"]["per_tool"]))
    return 0


def actions_table(per_tool: dict[str, dict[str, object]]) -> str:
    """The per-tool figures as a Markdown table (docs/actions.md)."""
    lines = [
        "| tool | n | exact | called | passes p50 | action ms p50 |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in per_tool.items():
        cells = [r["n"], r["exact_rate"], r["called_rate"], r["passes_p50"], r["action_ms_p50"]]
        lines.append(f"| `{name}` | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def _eval_calls(args: argparse.Namespace) -> int:
    from training.calls import CallsOptions, run_calls

    opts = CallsOptions(
        data=args.data,
        onnx=args.onnx,
        onnx_variant=args.onnx_variant,
        adapter=args.adapter,
        per_tool=args.per_tool,
        chat_limit=args.chat_limit,
        max_tokens=args.max_tokens,
        threads=args.threads,
    )
    try:
        report = run_calls(opts, log=_log)
    except FileNotFoundError as exc:
        print(f"quicksilver eval: {exc}", file=sys.stderr)
        return 2
    _write_report(args.json_out, report)
    print(json.dumps(report["summary"], indent=2))
    return 0


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
