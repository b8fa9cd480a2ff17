"""The tool-call corpus (quicksilver data --actions), its prompts in training, and the
held-out call check (quicksilver eval calls)."""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import replace

import pytest

from model.assemble import trained_for_tools
from model.tools import DEFAULT_TOOLS, call_ids, split_call
from tests.model.conftest import tiny_tokenizer
from tests.model.test_data import ending_model
from tests.schema import assert_fits_schema
from training.actions import (
    DEV_TEMPLATES,
    TEMPLATES,
    TOOLS,
    TOOLS_SYSTEM_PROMPT,
    ActionsConfig,
    commands,
    duration,
    make_actions,
    temperature,
    words,
)
from training.calls import command_row, summary
from training.data import DataConfig, Example, _norm, prompt_ids, read_jsonl, write_jsonl
from training.eval import EvalOptions, eval_prompts
from training.train import encode_examples

CFG = ActionsConfig(
    seed=5,
    commands=36,
    negatives=6,
    heldout_per_tool=2,
    heldout_negatives=3,
    loss_per_tool=1,
    dev_per_tool=2,
    dev_negatives=3,
)
DATA = DataConfig(max_reply_tokens=8, batch=4)


def test_numbers_and_durations_as_spoken():
    assert [words(n) for n in (0, 7, 13, 20, 21, 45)] == [
        "zero", "seven", "thirteen", "twenty", "twenty one", "forty five"
    ]  # fmt: skip
    assert words(21, hyphen=True) == "twenty-one"
    rng = random.Random(0)
    seen = {}
    for _ in range(2000):
        text, seconds = duration(rng)
        seen[text] = seconds
        if m := re.fullmatch(r"(\d+) (second|minute|hour)s?", text):
            unit = {"second": 1, "minute": 60, "hour": 3600}[m[2]]
            assert seconds == int(m[1]) * unit, text
    assert seen["five minutes"] == 300 and seen["an hour and a half"] == 5400
    assert seen["half an hour"] == 1800 and seen["a minute"] == 60
    temps = dict(temperature(rng) for _ in range(500))
    assert temps["21.5"] == 21.5 and temps["twenty one and a half"] == 21.5
    assert temps["twenty-one"] == 21 and temps["21"] == 21


def test_every_tool_gets_commands_whose_call_is_right():
    tok = tiny_tokenizer()
    ex = commands(tok, random.Random(1), 8, "train", set())
    assert {e.source for e in ex} == {f"command:{t.name}" for t in DEFAULT_TOOLS}
    for e in ex:
        call, spoken = split_call(e.reply)
        assert call is not None and spoken, e.reply
        tool = TOOLS[call.name]
        assert_fits_schema(tool, call.arguments)
        # the reply's ids: the call piece by piece, the confirmation, the end token
        head = call_ids(tok, tool, call.arguments)
        assert e.reply_ids == [*head, *tok.encode_plain(spoken), tok.im_end_id]
        for p in tool.params:  # strings are the user's words, verbatim
            if p.type == "string" and not p.enum and p.name in call.arguments:
                assert call.arguments[p.name] in e.question
        assert e.system == TOOLS_SYSTEM_PROMPT


def test_numbers_reach_the_call():
    tok = tiny_tokenizer()
    ex = commands(tok, random.Random(2), 60, "train", set())
    timers = {e.question: split_call(e.reply)[0] for e in ex if e.source == "command:timer.set"}
    checked = 0
    for q, call in timers.items():
        assert call is not None
        m = re.search(r"\b(\d+) minutes\b", q)
        if m and "hour" not in q and "half" not in q:
            assert call.arguments["seconds"] == 60 * int(m[1]), q
            checked += 1
    assert checked >= 3, timers  # the draw has such timers: the check above ran


def make(tmp_path, name):
    src = tmp_path / "distill"
    src.mkdir(exist_ok=True)
    tok = tiny_tokenizer()
    one = Example("Question?", "template", "Yes.", [*tok.encode_plain("Yes."), 2], True)
    write_jsonl(src / "train.jsonl", [replace(one, question=f"Question {i}?") for i in range(5)])
    write_jsonl(src / "heldout.jsonl", [replace(one, question=f"Held {i}?") for i in range(2)])
    out = tmp_path / name
    recipe = make_actions(ending_model(), tok, CFG, src, out, DATA, log=lambda _: None)
    return out, recipe


def test_same_seed_same_files_and_no_held_out_text_is_trained(tmp_path):
    a, recipe = make(tmp_path, "a")
    b, _ = make(tmp_path, "b")
    files = ("train.jsonl", "heldout.jsonl", "heldout_commands.jsonl", "heldout_chat.jsonl")
    for f in (*files, "dev_commands.jsonl", "dev_chat.jsonl", "recipe.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    train = read_jsonl(a / "train.jsonl")
    held = read_jsonl(a / "heldout_commands.jsonl")
    chat = read_jsonl(a / "heldout_chat.jsonl")
    dev = read_jsonl(a / "dev_commands.jsonl") + read_jsonl(a / "dev_chat.jsonl")
    assert len(held) == CFG.heldout_per_tool * len(TEMPLATES)
    assert recipe["dev_commands"] == CFG.dev_per_tool * len(TEMPLATES) and recipe["dev_chat"]
    trained = {_norm(e.question) for e in train}
    assert not trained & {_norm(e.question) for e in held + chat}
    assert not trained & {_norm(e.question) for e in dev}
    assert not {_norm(e.question) for e in dev} & {_norm(e.question) for e in held + chat}
    assert {e.source for e in dev} == {*(f"command:{t}" for t in TEMPLATES), "negative"}
    assert recipe["train_chat"] == 5 and recipe["train_commands"] == CFG.commands
    # an adapter trained on it says so in its manifest (training.train writes
    # {"command": "quicksilver data", **recipe}), so a server gives it the default tools
    (tmp_path / "adapter").mkdir(exist_ok=True)
    manifest = {"data": {"command": "quicksilver data", **recipe}}
    (tmp_path / "adapter" / "manifest.json").write_text(json.dumps(manifest))
    assert trained_for_tools(tmp_path / "adapter")
    assert all(e.system == TOOLS_SYSTEM_PROMPT for e in train + held + chat)
    # the chat split: the source's held-out questions, then the held-out negatives
    assert [e.question for e in chat[:2]] == ["Held 0?", "Held 1?"]
    assert all(split_call(e.reply)[0] is None for e in chat)
    loss = read_jsonl(a / "heldout.jsonl")
    assert len(loss) == len(TEMPLATES) * CFG.loss_per_tool + 2 + recipe["heldout_negatives"]


def test_a_grown_chat_corpus_never_trains_a_held_out_or_development_question(tmp_path):
    """A larger chat source (training/gpu_distill.sh writes 20k questions) may ask
    what a held-out or development row asks: those rows are left out of train.jsonl."""
    a, _ = make(tmp_path, "a")
    asked = [
        read_jsonl(a / f)[-1].question
        for f in ("heldout_commands.jsonl", "heldout_chat.jsonl", "dev_chat.jsonl")
    ]
    src = tmp_path / "distill"
    rows = read_jsonl(src / "train.jsonl")
    write_jsonl(src / "train.jsonl", [*rows, *(replace(rows[0], question=q) for q in asked)])
    tok = tiny_tokenizer()
    recipe = make_actions(ending_model(), tok, CFG, src, tmp_path / "b", DATA, log=lambda _: None)
    trained = {_norm(e.question) for e in read_jsonl(tmp_path / "b" / "train.jsonl")}
    assert not trained & {_norm(q) for q in asked}
    assert recipe["train_chat"] == len(rows)


def test_regenerating_keeps_the_held_out_chat_that_evals_measured(tmp_path):
    """The held-out negatives' replies are the teacher's greedy words, which another
    CPU's number formats can change: a corpus regenerated over an existing one keeps
    its held-out chat split (same held-out commands), and writes everything else anew."""
    a, _ = make(tmp_path, "a")
    chat = (a / "heldout_chat.jsonl").read_text()
    earlier = chat.replace('"reply": "', '"reply": "Well, ', 1)  # another machine's words
    assert earlier != chat
    (a / "heldout_chat.jsonl").write_text(earlier)
    (a / "train.jsonl").write_text("")
    make(tmp_path, "a")
    assert (a / "heldout_chat.jsonl").read_text() == earlier
    assert read_jsonl(a / "train.jsonl")  # the rest is written again
    held = read_jsonl(a / "heldout_commands.jsonl")
    (a / "heldout_commands.jsonl").write_text("")  # other held-out commands: a new split
    write_jsonl(a / "heldout_commands.jsonl", held[1:])
    make(tmp_path, "a")
    assert (a / "heldout_chat.jsonl").read_text() == chat


def test_training_prompts_carry_the_example_system_prompt(tmp_path):
    tok = tiny_tokenizer()
    plain = Example("Hi?", "template", "Hello.", [5, 6, 2], True)
    tools = replace(plain, system=TOOLS_SYSTEM_PROMPT)
    items = encode_examples(tok, [plain, tools], 4)
    assert items[0][0] == prompt_ids(tok, "Hi?")  # the existing corpus: unchanged
    assert items[1][0] == prompt_ids(tok, "Hi?", system=TOOLS_SYSTEM_PROMPT)
    assert "Tools: timer.set(seconds)" in tok.decode(items[1][0])
    assert items[0][1] == items[1][1] == [5, 6, 2, 2]
    # rows without a system prompt are written as the corpus always had them
    write_jsonl(tmp_path / "x.jsonl", [plain, tools])
    rows = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert "system" not in rows[0] and rows[1]["system"] == TOOLS_SYSTEM_PROMPT
    assert read_jsonl(tmp_path / "x.jsonl") == [plain, tools]


def test_a_call_counts_only_when_tool_and_arguments_are_exact():
    e = Example(
        "Set a timer for five minutes.",
        "command:timer.set",
        '<tool_call>{"name": "timer.set", "arguments": {"seconds": 300}}</tool_call>Timer set.',
        [],
        True,
    )
    right = command_row(e, e.reply, 7)
    wrong = command_row(e, e.reply.replace("300", "30"), 7)
    spoken = command_row(e, "Sure, five minutes.", 9)
    assert (right["exact"], right["spoken"]) == (True, "Timer set.")
    assert (wrong["exact"], wrong["right_tool"], wrong["starts_call"]) == (False, True, True)
    assert (spoken["exact"], spoken["starts_call"]) == (False, False)
    chat = [{"trigger": True, "mentions_call": True, "passes": 3}] + [
        {"trigger": False, "mentions_call": False, "passes": 5}
    ] * 3
    s = summary([right, wrong, spoken], chat)
    assert s["exact"] == pytest.approx(1 / 3) and s["starts_call"] == pytest.approx(2 / 3)
    assert s["false_triggers"] == 0.25
    assert s["per_tool"]["timer.set"]["passes"] == pytest.approx(23 / 3)


def test_eval_llm_with_tools_asks_the_diffusion_model_only_under_the_tools_prompt():
    tok = tiny_tokenizer()
    ar, asked = eval_prompts(tok, ["Hi?"], EvalOptions(system=TOOLS_SYSTEM_PROMPT))
    assert ar == [prompt_ids(tok, "Hi?")]  # the reference and the scorer: spoken prompt
    assert asked == [prompt_ids(tok, "Hi?", system=TOOLS_SYSTEM_PROMPT)]
    assert eval_prompts(tok, ["Hi?"], EvalOptions()) == (ar, ar)


def _carrier(template: str) -> tuple[str, ...]:
    """A template's words with its slots and punctuation taken out."""
    return tuple(w.strip(",.?!") for w in template.lower().split() if not w.startswith("{"))


def test_no_held_out_or_development_phrasing_is_trained():
    """The held-out and development commands test phrasings never trained on (and not
    each other's): no template of a tool in one list opens with another list's first two
    words or has its words."""
    for name, (train_t, held_t) in TEMPLATES.items():
        lists = [train_t, held_t, DEV_TEMPLATES[name]]
        for i, j in ((0, 1), (0, 2), (1, 2)):
            for one, _, _ in lists[i]:
                for other, _, _ in lists[j]:
                    assert _carrier(one) != _carrier(other), (name, one, other)
                    assert one.lower().split()[:2] != other.lower().split()[:2], (name, one)


def test_the_held_out_commands_stay_fixed():
    """Training templates and asks may grow; the held-out split's 240 commands (its own
    templates, its own draws) stay the ones every eval in docs/actions.md measured."""
    cfg = ActionsConfig()
    rng = random.Random(cfg.seed + 1)
    held = commands(tiny_tokenizer(), rng, cfg.heldout_per_tool, "heldout", set())
    digest = hashlib.sha256("\n".join(e.question for e in held).encode()).hexdigest()
    assert digest == "86500d2ce3cc5b16e12c9141f595eacf406534dad03d467bf54e98940fe262b6"


def test_data_actions_command_writes_the_tool_corpus(tmp_path, monkeypatch, capsys):
    """``quicksilver data --actions`` (docs/training.md) reaches make_actions with its
    counts; asking for two corpora at once is refused."""
    from cli.main import main

    seen = {}

    def fake(model, tok, cfg, source, out, data_cfg, log, command):
        seen.update(cfg=cfg, source=source, out=out, data_cfg=data_cfg, command=command)
        return {"train": 0}

    monkeypatch.setattr("training.actions.make_actions", fake)
    monkeypatch.setattr("model.nn.gguf.load_smollm2", lambda f: None)
    argv = ["data", "--actions", "--seed", "7", "--commands", "24", "--out", str(tmp_path)]
    assert main([*argv, "--negatives", "3", "--batch", "4"]) == 0
    assert seen["cfg"] == ActionsConfig(seed=7, commands=24, negatives=3)
    assert (seen["out"], seen["data_cfg"].batch, seen["data_cfg"].device) == (tmp_path, 4, "cpu")
    assert seen["command"].startswith("quicksilver data --actions --seed 7 --commands 24 ")
    assert main([*argv, "--own-replies", str(tmp_path)]) == 2
    assert "two corpora" in capsys.readouterr().err
