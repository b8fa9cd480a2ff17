"""The README's command list against the parsers: every command is there with every
option it takes, no option the parser does not know, and the defaults it shows are the
parser's (README, "Command line")."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from cli.main import _parser
from tests.test_layout import README

# An option and the value shown after it, if any: "[--port 8765]", "--json FILE".
OPTION = re.compile(r"(--[a-z][a-z0-9-]*)(?:[ =]([^\s\[\]()]+))?")
# "quicksilver COMMAND ..." lists the options every command takes
EVERY = "COMMAND"


def synopsis(text: str) -> dict[str, str]:
    """Command ("serve", "bench loop") -> its lines of the Command line block, comments
    left out; a line that does not start with ``quicksilver`` goes on the one above."""
    block = text.split("## Command line", 1)[1].split("```", 2)[1]
    commands: dict[str, str] = {}
    name = ""
    for line in block.splitlines():
        line = line.split("#", 1)[0]
        if line.startswith("quicksilver "):
            words = re.split(r"\s(?=[-\[(.])", line.removeprefix("quicksilver "), maxsplit=1)
            name = words[0].strip()
            line = words[1] if len(words) > 1 else ""
        if name:
            commands[name] = commands.get(name, "") + " " + line
    return commands


def shown(text: str) -> dict[str, str | None]:
    """Option -> the value shown after it (None: none, a flag)."""
    return {m[1]: m[2] for m in OPTION.finditer(text)}


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, list[argparse.Action]]]:
    """(command, the options it takes, its parents' included) for every command."""
    own = [
        a
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction | argparse._VersionAction)
    ]
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), own
        return
    for name, sub in subs[0].choices.items():
        for command, actions in leaves(sub, (*path, name)):
            yield command, own + actions


def commands() -> dict[str, list[argparse.Action]]:
    return dict(leaves(_parser()))


def problems(text: str, parsed: dict[str, list[argparse.Action]]) -> list[str]:
    """What the README's block gets wrong about the parsers, one line each."""
    lines = synopsis(text)
    common = shown(lines.pop(EVERY, ""))
    out = [f"{c}: not in the README" for c in parsed if c not in lines]
    out += [f"{c}: no such command" for c in lines if c not in parsed]
    for command, actions in parsed.items():
        if command not in lines:
            continue
        doc = shown(lines[command])
        known = {s for a in actions for s in a.option_strings}
        out += [f"{command}: no option {name}" for name in doc if name not in known]
        out += [
            f"{command}: no option {name}, which the README gives every command"
            for name in common
            if name not in known
        ]
        for action in actions:
            names = [s for s in action.option_strings if s in doc or s in common]
            if not names:
                out.append(f"{command}: {action.option_strings[-1]} is not in the README")
                continue
            if isinstance(action, argparse.BooleanOptionalAction):
                # --x / --no-x: the README shows the one that changes the default
                change = action.option_strings[bool(action.default)]
                if names != [change]:
                    shows = " ".join(names)
                    out.append(f"{command}: shows {shows}, not {change}, which changes the default")
                continue
            value = doc.get(names[0], common.get(names[0]))
            if (wrong := wrong_default(action, value)) is not None:
                out.append(f"{command}: {names[0]} shows {value}, the default is {wrong}")
    return out


def wrong_default(action: argparse.Action, value: str | None) -> str | None:
    """The parser's default when the value the README shows for it is another one.

    The value shown is a default when it is lowercase (an UPPERCASE word stands for a
    value): itself, or the first of ``a|b`` choices. An option whose default is None or
    a list is not judged."""
    if value is None or action.default is None or isinstance(action.default, list | bool):
        return None
    first = value.split("|", 1)[0]
    if first != first.lower():
        return None
    default = str(action.default)
    try:
        same = float(first) == float(default)
    except ValueError:
        same = first == default
    return None if same else default


def test_the_readme_lists_every_command_and_option_with_its_default() -> None:
    assert problems(README.read_text(), commands()) == []


def test_the_check_finds_what_the_readme_gets_wrong() -> None:
    parser = argparse.ArgumentParser(prog="quicksilver")
    sub = parser.add_subparsers()
    serve = sub.add_parser("serve")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--asr", default="auto")
    serve.add_argument("--tools", choices=("auto", "none"), default="auto")
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument("--spans", action=argparse.BooleanOptionalAction, default=True)
    bench = sub.add_parser("bench").add_subparsers()
    loop = bench.add_parser("loop")
    loop.add_argument("--url")
    loop.add_argument("--log-level", default="INFO")
    parsed = dict(leaves(parser))
    assert sorted(parsed) == ["bench loop", "serve"]

    def readme(lines: str) -> str:
        return f"## Command line\n\n```\n{lines}\n```\n"

    good = (
        "quicksilver serve [--port 8765] [--asr auto|tiny.en|DIR]  # a comment --nope\n"
        "                  [--tools auto|none] [--no-spans]\n"
        "quicksilver bench loop [--url URL]\n"
        "quicksilver COMMAND ... [--log-level INFO|DEBUG]\n"
    )
    assert problems(readme(good), parsed) == []
    assert problems(readme(good.replace("[--asr auto|tiny.en|DIR]", "")), parsed) == [
        "serve: --asr is not in the README"
    ]
    assert problems(readme(good.replace("--asr auto|", "--asr tiny.en|auto|")), parsed) == [
        "serve: --asr shows tiny.en|auto|tiny.en|DIR, the default is auto"
    ]
    assert problems(readme(good.replace("--no-spans", "--spans")), parsed) == [
        "serve: shows --spans, not --no-spans, which changes the default"
    ]
    assert problems(readme(good.replace("8765", "80")), parsed) == [
        "serve: --port shows 80, the default is 8765"
    ]
    assert problems(readme(good.replace("[--url URL]", "[--url URL] [--runs 2]")), parsed) == [
        "bench loop: no option --runs"
    ]
    assert problems(readme(good.replace("quicksilver bench loop [--url URL]\n", "")), parsed) == [
        "bench loop: not in the README"
    ]
    every = good.replace("quicksilver COMMAND ...", "quicksilver serve")
    assert problems(readme(every), parsed) == ["bench loop: --log-level is not in the README"]
    assert problems(readme(good + "quicksilver COMMAND ... [--verbose]\n"), parsed) == [
        "serve: no option --verbose, which the README gives every command",
        "bench loop: no option --verbose, which the README gives every command",
    ]
