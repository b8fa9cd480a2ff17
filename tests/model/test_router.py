"""The tool router (model/router.py) and its fit (training/router.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from model.actions import CallOptions, decode_call, said_shapes, shape_names, shapes
from model.diffusion_engine import CANNOT_ACT, smollm2_diffusion_config
from model.engine import ChatMessage, drain
from model.modeldir import SHIPPED_ADAPTER
from model.nn.backend import TorchBackend
from model.router import (
    ACT,
    ROUTER_FILE,
    SPEAK,
    ToolRouter,
    WordExpert,
    find_router,
    tool_of,
    word_set,
)
from model.tools import CALL_OPEN, DEFAULT_TOOLS, ToolCall, parse_tools, said_value, shape_name
from training.router import (
    RouterOptions,
    Row,
    accuracy,
    choose_l2,
    conversations,
    fit_router,
    fit_softmax,
    fit_words,
    read_rows,
)

from .conftest import tiny_tokenizer
from .test_actions import TOOLS, USER, CallsFirst, prefilled
from .test_ask import own_commands
from .test_diffusion import tiny_diffusion, tiny_generator

SHAPES = ("lights.set(on=false)", "lights.set(on=true)", "timer.cancel()")
# act or speak, the tool columns, then the shapes
NAMES = (SPEAK, ACT, "lights.set", "timer.cancel", *SHAPES)


def clusters(
    n: int, rng: np.random.Generator, k: int = 3, spread: float = 3.0
) -> tuple[np.ndarray, np.ndarray]:
    """k Gaussian clusters in 6 dimensions, n points each."""
    centres = rng.normal(0, spread, (k, 6))
    x = np.concatenate([c + rng.normal(0, 1, (n, 6)) for c in centres]).astype(np.float32)
    return x, np.repeat(np.arange(k), n)


def test_the_softmax_fit_separates_what_is_separable() -> None:
    x, y = clusters(40, np.random.default_rng(0))
    w, b = fit_softmax(x, y, 3, l2=1e-3, steps=500, lr=0.05)
    assert ((x @ w + b).argmax(1) == y).mean() == 1.0
    w0, _ = fit_softmax(x, y, 3, l2=1e-3, steps=0, lr=0.05)
    assert not w0.any()  # it starts from zero: the fit is what separates them


def test_the_folded_router_scores_the_logits_as_the_fit_scored_the_states() -> None:
    """Projection, standardisation and the three regressions fold into one (V, K)
    matrix; the tool and shape classifiers learn from the commands alone."""
    rng = np.random.default_rng(1)
    table = rng.normal(size=(50, 6)).astype(np.float32)  # (V, C): a tied head
    to_hidden = np.linalg.pinv(table).astype(np.float32)  # (C, V)
    states, y = clusters(30, rng, k=4, spread=6.0)  # the fourth is chat; sure decisions
    logits = states @ table.T  # what the head writes for each state
    labels = [SHAPES[i] if i < 3 else None for i in y]
    router = fit_router(logits, labels, to_hidden, RouterOptions(Path(".")), "sha")
    assert router.names == NAMES and router.weights.shape == (50, 7)
    fitted = accuracy(router, logits, labels)
    assert (fitted["commands"], fitted["chat"]) == (90, 30)
    assert (fitted["commands_acted"], fitted["chat_acted"]) == (1.0, 0.0)
    assert fitted["accuracy"] == fitted["tool_accuracy"] == 1.0
    assert fitted["per_tool"] == {"lights.set": 1.0, "timer.cancel": 1.0}
    # the same scores as the unfolded pipeline
    hidden = logits @ to_hidden.T
    mu, sd = hidden.mean(0), hidden.std(0) + 1e-6
    commands = y < 3
    x = (hidden[commands] - mu) / sd
    w, b = fit_softmax(x, y[commands], 3, 3e-3, 1500, 0.05)  # the shape classifier
    assert np.allclose(router.scores(logits[0])[4:], x[0] @ w + b, atol=1e-3)


def test_each_classifier_s_l2_is_chosen_on_the_development_rows() -> None:
    """Separable clusters: every L2 of a sane grid names the development rows right, so
    the sharpest fit (the least cross-entropy) wins; an L2 that flattens the classifier
    never does, and every try is recorded."""
    rng = np.random.default_rng(2)
    table = rng.normal(size=(50, 6)).astype(np.float32)
    to_hidden = np.linalg.pinv(table).astype(np.float32)
    states, y = clusters(40, rng, k=4, spread=6.0)
    logits = states @ table.T
    labels = [SHAPES[i] if i < 3 else None for i in y]
    dev = np.arange(len(y)) % 4 == 0  # a quarter held back as the development rows
    fit_labels = [lab for lab, d in zip(labels, dev, strict=True) if not d]
    dev_labels = [lab for lab, d in zip(labels, dev, strict=True) if d]
    opts = RouterOptions(Path("."), steps=300)
    grid = (1e-3, 1e-2, 1e3)
    chosen, tried = choose_l2(
        logits[~dev], fit_labels, logits[dev], dev_labels, to_hidden, opts, grid
    )
    assert chosen == {"act": 1e-3, "tool": 1e-3, "shape": 1e-3}
    assert set(tried) == {"act", "tool", "shape"}
    assert tried["tool"]["0.001"][0] == 1.0 and tried["tool"]["1000.0"][1] > 0.5
    router = fit_router(logits[~dev], fit_labels, to_hidden, opts, "sha", chosen)
    assert router.info["l2"] == chosen
    assert accuracy(router, logits[dev], dev_labels)["accuracy"] == 1


def a_router(
    favour: str, vocab: int = 8, sha: str = "abc", act: bool = True, names: tuple[str, ...] = NAMES
) -> ToolRouter:
    """A router that acts (or speaks) and favours the shape ``favour`` and its tool,
    whatever it reads."""
    chosen = (favour, tool_of(favour), ACT if act else SPEAK)
    bias = np.array([5.0 if n in chosen else 0.0 for n in names], np.float32)
    return ToolRouter(names, np.zeros((vocab, len(names)), np.float32), bias, sha, {"n": 1})


def test_it_tells_acting_from_speaking_when_it_was_fitted_to() -> None:
    row = np.zeros(8, np.float32)
    assert a_router("timer.cancel()").acts(row) is True
    assert a_router("timer.cancel()", act=False).acts(row) is False
    assert a_router("timer.cancel()", names=NAMES[2:]).acts(row) is None  # no act classifier
    unsure = a_router("timer.cancel()")
    unsure.bias[:2] = (0.0, 2.9)  # log-odds 2.9: probability 0.948, under 0.95
    assert unsure.acts(row) is None  # the model's first token decides
    # its log-odds go on the call (ToolCall.margin), so the session can ask about it
    assert unsure.margin(row) == pytest.approx(2.9)
    assert a_router("timer.cancel()", names=NAMES[2:]).margin(row) is None


def test_it_chooses_among_the_session_s_shapes_for_tools_it_was_fitted_on() -> None:
    router = a_router("lights.set(on=true)")
    row = np.zeros(8, np.float32)
    both = ["lights.set(on=true)", "lights.set(on=false)", "timer.cancel()"]
    assert router.choose(row, both) == "lights.set(on=true)"
    router = a_router("lights.set(on=false)")
    assert router.choose(row, both) == "lights.set(on=false)"
    # a part of them: it still chooses (the probe reads the state of a shorter list)
    assert (
        router.choose(row, ["lights.set(on=false)", "lights.set(on=true)"])
        == "lights.set(on=false)"
    )
    # a tool it does not know, or one of its own with another schema: the model decides
    assert router.choose(row, [*both, "doors.lock()"]) is None
    assert router.choose(row, ["timer.cancel(reason)", *both[:2]]) is None
    assert router.choose(row, ["lights.set(on=true)"]) is None  # a shape of it missing
    assert router.choose(row, []) is None


def test_a_request_for_a_tool_the_session_lacks_is_told_from_the_nearest_one() -> None:
    router = a_router("timer.cancel()")
    router.bias[NAMES.index("lights.set")] = 4.0  # the next best tool
    row = np.zeros(8, np.float32)
    lights = ["lights.set(on=true)", "lights.set(on=false)"]
    assert router.absent(row, lights) == "timer.cancel"  # never lights.set
    assert router.absent(row, [*lights, "timer.cancel()"]) is None
    # the words decide with the state: "lights" tips it to the session's own tool
    expert = words_for(NAMES, {"lights": ("lights.set",)})
    assert dataclasses.replace(router, words=expert).absent(row, lights, "lights") is None


def test_a_direction_said_is_the_only_one_a_volume_change_can_take() -> None:
    """ "Could you make it quieter?" was ``{change: up}`` in the typed eval: the router
    chose the shape. The words name the value, so the other is no choice."""
    (volume,) = [t for t in DEFAULT_TOOLS if t.name == "volume.set"]
    assert set(said_shapes([volume], "Uh, could you make it quieter please!")) == {
        "volume.set()",
        "volume.set(change=down)",
    }
    assert set(said_shapes([volume], "a little louder")) == {
        "volume.set()",
        "volume.set(change=up)",
    }
    both = {"volume.set()", "volume.set(change=up)", "volume.set(change=down)"}
    assert set(said_shapes([volume], "take it up a notch")) == both  # both directions' words
    assert set(said_shapes([volume], "the volume please")) == both  # neither
    # a session's own volume.set may mean other words by its values
    (own,) = parse_tools(
        [
            {
                "name": "volume.set",
                "parameters": {
                    "type": "object",
                    "properties": {"change": {"type": "string", "enum": ["up", "down"]}},
                },
            }
        ]
    )
    assert set(said_shapes([own], "make it quieter")) == {
        "volume.set()",
        "volume.set(change=up)",
        "volume.set(change=down)",
    }


def test_every_volume_change_of_the_project_s_commands_says_its_own_direction() -> None:
    """The words that name a direction never name the other one in data/actions'
    volume changes (trained, held out and development): choosing by them never
    reverses a command the model was taught."""
    (volume,) = [t for t in DEFAULT_TOOLS if t.name == "volume.set"]
    (change,) = [p for p in volume.params if p.name == "change"]
    changes = [
        (t, c) for t, c in own_commands() if c.name == "volume.set" and "change" in c.arguments
    ]
    assert len(changes) >= 150
    said = [(t, c.arguments["change"], said_value(volume, change, t)) for t, c in changes]
    assert [s for s in said if s[2] not in (None, s[1])] == []
    assert sum(s[2] == s[1] for s in said) >= 0.9 * len(said)  # most name theirs


def test_a_number_said_decides_whether_an_optional_number_is_in_the_call() -> None:
    (volume,) = [t for t in DEFAULT_TOOLS if t.name == "volume.set"]
    with_level = {
        "volume.set(level)",
        "volume.set(level,change=up)",
        "volume.set(level,change=down)",
    }
    assert set(said_shapes([volume], "Uh put the volume at 8, please.")) == with_level
    rest = set(shape_names([volume])) - with_level
    assert set(said_shapes([volume], "volume at 42")) == rest  # 42 is no level (0-10)
    assert "volume.set(level)" not in said_shapes([volume], "louder")  # no level to make up
    timer = [t for t in DEFAULT_TOOLS if t.name == "timer.set"]
    assert said_shapes(timer, "a timer please") == shape_names(timer)  # a required number
    # the router picks the tool, then its best shape among the fitting ones
    router = a_router("lights.set(on=true)")
    row = np.zeros(8, np.float32)
    both = ["lights.set(on=true)", "lights.set(on=false)", "timer.cancel()"]
    assert router.choose(row, both, fits=["lights.set(on=false)"]) == "lights.set(on=false)"
    assert router.choose(row, both, fits=["timer.cancel()"]) == "lights.set(on=true)"


def words_for(
    names: tuple[str, ...], favour: dict[str, tuple[str, ...]], score: float = 5.0
) -> WordExpert:
    """A word expert that gives each word ``score`` on the columns ``favour`` names for it."""
    words = tuple(sorted(favour))
    weights = np.zeros((len(words), len(names)), np.float32)
    for i, w in enumerate(words):
        weights[i, [names.index(n) for n in favour[w]]] = score
    return WordExpert(words, weights, np.zeros(len(names), np.float32))


def test_the_word_expert_reads_which_words_a_request_has() -> None:
    assert word_set("Um, turn the LIGHTS off, off! It's 9.") == {
        "um",
        "turn",
        "the",
        "lights",
        "off",
        "it's",
    }
    expert = words_for(NAMES, {"lights": ("lights.set",), "off": ("lights.set(on=false)",)})
    got = expert.scores("Lights OFF, off please")  # a word counts once; unknown ones nothing
    assert got[NAMES.index("lights.set")] == 5.0 and got[NAMES.index("lights.set(on=false)")] == 5.0
    assert not expert.scores("hello there").any()
    assert got[:2].tolist() == [0.0, 0.0]


def test_the_words_decide_the_call_where_the_state_leans_weakly_the_other_way() -> None:
    row = np.zeros(8, np.float32)
    both = ["lights.set(on=true)", "lights.set(on=false)", "timer.cancel()"]
    weak = a_router("timer.cancel()")
    weak.bias[[NAMES.index("timer.cancel"), NAMES.index("timer.cancel()")]] = 1.0
    expert = words_for(NAMES, {"lights": ("lights.set",), "off": ("lights.set(on=false)",)})
    router = dataclasses.replace(weak, words=expert)
    assert router.choose(row, both, text="um, lights off") == "lights.set(on=false)"
    assert router.choose(row, both, text="cancel it") == "timer.cancel()"  # no word it knows
    assert router.choose(row, both) == "timer.cancel()"  # no text: the state alone
    assert router.acts(row) is True and router.scores(row, "lights off")[:2].tolist() == [0, 5]


def clustered_router(
    seed: int, said: tuple[str, str, str, str]
) -> tuple[
    np.random.Generator,
    np.ndarray,
    np.ndarray,
    tuple[list[str], list[str | None], RouterOptions, ToolRouter],
]:
    """Training rows for the three shapes and chat in four clusters of a 6-d state seen
    through a 50-logit head, each row saying ``said[cluster]`` and a filler word, and
    the router fitted on them; returns the generator to draw development rows from, the
    head, the cluster centres and (texts, labels, options, router)."""
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(50, 6)).astype(np.float32)
    to_hidden = np.linalg.pinv(table).astype(np.float32)
    centres = rng.normal(0, 6.0, (4, 6))
    y = np.repeat(np.arange(4), 30)
    states = (centres[y] + rng.normal(0, 1, (len(y), 6))).astype(np.float32)
    labels = [SHAPES[i] if i < 3 else None for i in y]
    texts = [f"{said[i]} {rng.choice(['please', 'now', 'ok'])}" for i in y]
    opts = RouterOptions(Path("."), steps=300)
    router = fit_router(states @ table.T, labels, to_hidden, opts, "sha")
    return rng, table, centres, (texts, labels, opts, router)


def test_the_word_expert_is_fitted_only_where_the_development_rows_say_it_helps() -> None:
    """The development requests are phrased unlike training: their states sit between
    two tools' clusters. Words that name the tool fix them, so the expert joins the
    router; where the state is right already, an expert that cannot help does not."""
    said = ("lights off", "lights on", "cancel the timer", "hello there")
    rng, table, centres, (texts, labels, opts, router) = clustered_router(3, said)
    # development: lights off that looks halfway to cancelling the timer, and the rest
    dy = np.repeat(np.arange(4), 10)
    mid = np.where(dy[:, None] == 0, (centres[0] + centres[2]) / 2, centres[dy])
    dev_states = (mid + rng.normal(0, 0.3, mid.shape)).astype(np.float32)
    dev_labels = [SHAPES[i] if i < 3 else None for i in dy]
    dev = (dev_states @ table.T, dev_labels, [said[i] for i in dy])
    plain = accuracy(router, *dev[:2])["accuracy"]
    fitted, tried = fit_words(router, texts, labels, dev, opts, (1e-3,), (0.0, 1.0, 4.0))
    assert fitted.words is not None and fitted.info["words"]["weight"] > 0
    assert accuracy(fitted, *dev[:2], texts=dev[2])["accuracy"] == 1.0 > plain
    assert set(tried) == {"0.001 x 0", "0.001 x 1", "0.001 x 4", "act"}
    # where the state already names every development row, the words add nothing
    plain_dev = ((centres[dy] + rng.normal(0, 0.3, mid.shape)) @ table.T).astype(np.float32)
    same = ["please"] * len(texts)
    kept, _ = fit_words(router, same, labels, (plain_dev, dev_labels, dev[2]), opts, (1e-3,))
    assert kept.words is None and kept.info["words"]["weight"] == 0


def test_the_words_decide_act_or_speak_where_a_drifted_state_gets_it_wrong() -> None:
    """After earlier turns the state can be sure the wrong way: acting on "good night",
    speaking to "lights off please". The act part of the word expert, fitted on every
    training row's words, is chosen on the development rows only where it acts on less
    chat, and it outweighs the state there; the words alone never act on chat here."""
    said = ("lights off", "lights on", "cancel the timer", "good night")
    rng, table, centres, (texts, labels, opts, router) = clustered_router(5, said)
    # development rows after other turns: each in its own state, but "good night" sits
    # on the lights-off cluster (the state acts) and a third of the commands on chat's
    dy = np.repeat(np.arange(4), 12)
    where = np.where(dy == 3, 0, dy)
    where[(dy < 3) & (np.arange(len(dy)) % 3 == 0)] = 3
    dev_states = (centres[where] + rng.normal(0, 0.3, (len(dy), 6))).astype(np.float32)
    dev_labels = [SHAPES[i] if i < 3 else None for i in dy]
    dev = (dev_states @ table.T, dev_labels, [said[i] for i in dy])
    before = accuracy(router, *dev[:2], texts=dev[2])
    assert before["chat_acted"] == 1.0 and before["commands_acted"] < 0.7
    fitted, tried = fit_words(router, texts, labels, dev, opts, (1e-3,), (0.0,), None, (0.0, 8.0))
    assert set(tried["act"]) == {"0.001 x 0", "0.001 x 8"}
    assert fitted.info["act_words"]["weight"] == 8.0 and fitted.words is not None
    after = accuracy(fitted, *dev[:2], texts=dev[2])
    assert after["chat_acted"] == 0.0 and after["commands_acted"] == 1.0
    # only the act-or-speak columns: the tool and shape parts stayed at weight 0
    assert not fitted.words.weights[:, 2:].any()
    assert not fitted.words.scores("good night")[2:].any()


def test_every_way_to_lay_out_a_call_has_one_name() -> None:
    names = shape_names(DEFAULT_TOOLS)
    assert len(names) == len(set(names)) == len(shapes(tiny_tokenizer(), DEFAULT_TOOLS))
    assert names == [s.name for s in shapes(tiny_tokenizer(), DEFAULT_TOOLS)]
    volume = next(t for t in DEFAULT_TOOLS if t.name == "volume.set")
    assert shape_name(volume, {"change": "down"}) == "volume.set(change=down)"
    assert shape_name(volume, {"level": 3, "change": "up"}) == "volume.set(level,change=up)"
    assert "volume.set(change=down)" in names and "lights.set(on=false)" in names


def test_a_saved_router_loads_the_same(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    weights = rng.normal(size=(8, len(NAMES))).astype(np.float32)
    router = ToolRouter(NAMES, weights, np.ones(len(NAMES), np.float32), "s", {"a": 1})
    router.save(tmp_path / ROUTER_FILE)
    back = ToolRouter.load(tmp_path / ROUTER_FILE)
    assert (back.names, back.adapter_sha256, back.info) == (NAMES, "s", {"a": 1})
    row = rng.normal(size=8).astype(np.float32)
    assert np.allclose(back.scores(row), router.scores(row), atol=1e-2)  # weights in fp16
    assert back.words is None
    expert = words_for(NAMES, {"lights": ("lights.set",), "off": ("lights.set(on=false)",)})
    dataclasses.replace(router, words=expert).save(tmp_path / ROUTER_FILE)
    back = ToolRouter.load(tmp_path / ROUTER_FILE)
    assert back.words is not None and back.words.words == ("lights", "off")
    assert np.allclose(
        back.scores(row, "lights off"), router.scores(row) + expert.scores("off lights"), atol=1e-2
    )


def _model_dir(path: Path, sha: str | None) -> Path:
    adapter = {"weights": {"sha256": sha}} if sha else None
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"source": {"adapter": adapter}}))
    return path


def test_a_model_directory_gets_the_router_of_its_own_adapter(tmp_path: Path) -> None:
    place = tmp_path / "adapter"
    place.mkdir()
    a_router("timer.cancel()", sha="mine").save(place / ROUTER_FILE)
    mine = _model_dir(tmp_path / "mine", "mine")
    found = find_router(mine, [tmp_path / "elsewhere", place], vocab=8)
    assert found is not None and found.adapter_sha256 == "mine"
    assert find_router(_model_dir(tmp_path / "other", "other"), [place]) is None
    assert find_router(_model_dir(tmp_path / "base", None), [place]) is None
    with pytest.raises(ValueError, match="reads 8 logits"):
        find_router(mine, [place], vocab=9)


def test_the_shipped_router_belongs_to_the_shipped_tools_adapter() -> None:
    """A retrained tools adapter needs its router refitted (`quicksilver router`)."""
    tools = SHIPPED_ADAPTER
    router = ToolRouter.load(tools / ROUTER_FILE)
    weights = hashlib.sha256((tools / "adapter.safetensors").read_bytes()).hexdigest()
    assert router.adapter_sha256 == weights
    assert router.weights.shape == (49152, len(router.names))
    tools = [t.name for t in DEFAULT_TOOLS]
    assert set(router.names[2:]) <= {*tools, *shape_names(DEFAULT_TOOLS)}
    assert set(router.tools) == set(tools)
    assert router.names[:2] == (SPEAK, ACT)
    assert router.words is not None  # the word expert, fitted beside the state probe
    assert router.words.weights.shape == (len(router.words.words), len(router.names))


@pytest.mark.models
@pytest.mark.slow
def test_the_served_engine_routes_held_out_requests(smollm2_gguf, model_cache: Path) -> None:  # type: ignore[no-untyped-def]
    """The served int8 engine with the shipped router, scored here on held-out rows
    (data/actions, never trained or fitted on), not read back from the router's
    record: two commands of each default tool and as many chat questions, half of them
    after earlier turns of the same rows, as a session asks them."""
    from cli.main import prepare_model
    from model.assemble import load_generator

    prepare_model("diffusion-onnx", model_cache)  # what serve builds (tests/conftest.py)
    gen = load_generator("diffusion-onnx", model_cache)
    assert (
        gen.router is not None
        and gen.router.adapter_sha256
        == ToolRouter.load(SHIPPED_ADAPTER / ROUTER_FILE).adapter_sha256
    )
    data = Path(__file__).parents[2] / "data" / "actions"
    commands: dict[str, list[Row]] = {}
    for row in read_rows(data / "heldout_commands.jsonl"):
        assert row.shape is not None
        commands.setdefault(tool_of(row.shape), []).append(row)
    asked = [r for rows in commands.values() for r in rows[:2]]
    assert len(asked) == 2 * len(DEFAULT_TOOLS)
    chat = read_rows(data / "heldout_chat.jsonl")[: len(asked)]
    rows = asked + chat
    named, acted_on_chat = [], []
    for row, convo in zip(rows, conversations(rows, 0.5, seed=0), strict=True):
        items, _ = drain(gen.generate(convo, 4, lambda: False, DEFAULT_TOOLS))
        calls = [i.name for i in items if isinstance(i, ToolCall)]
        if row.shape is None:
            acted_on_chat.append(bool(calls))
        else:
            named.append(calls == [tool_of(row.shape)])
    # as fitted, on all 240 commands and 86 questions: 0.96 of the tools right, no
    # question acted on; here at most 2 of the 24 commands missed, 1 question acted on
    assert sum(named) >= len(named) - 2, named
    assert sum(acted_on_chat) <= 1, acted_on_chat


def test_a_routed_call_is_laid_out_as_routed_whatever_the_model_would_write() -> None:
    tools = {t.name: t for t in TOOLS}
    for shape in ("timer.cancel()", "lights.set(on=false)", "volume.set(change=down)"):
        backend, cache, last, tok = prefilled(0)
        config = smollm2_diffusion_config(tok)
        done = decode_call(
            backend, tok, cache, last, TOOLS, USER, config, CallOptions(8, shape=shape)
        )
        assert done is not None
        assert shape_name(tools[done.call.name], done.call.arguments) == shape
    with pytest.raises(ValueError, match="is laid out as 'doors"):
        decode_call(
            backend, tok, cache, last, TOOLS, USER, config, CallOptions(8, shape="doors.lock()")
        )


def test_the_engine_asks_its_router_whether_to_act_and_which_call() -> None:
    gen, _ = tiny_generator()
    tok = gen.tokenizer
    gen.backend = gen.prefixes.backend = TorchBackend(tiny_diffusion(4), max_len=1024)
    convo = [ChatMessage("user", "set a timer for 5 minutes")]
    names = [SPEAK, ACT, *(t.name for t in TOOLS), *shape_names(TOOLS)]
    tools = {t.name: t for t in TOOLS}
    for favour in ("timer.cancel()", "lights.set(on=false)"):
        gen.router = a_router(favour, gen.backend.vocab_size, names=tuple(names))
        # the tiny model's first token never opens a call: the router decides
        items, _ = drain(gen.generate(convo, 32, lambda: False, TOOLS))
        calls = [i for i in items if isinstance(i, ToolCall)]
        assert [shape_name(tools[c.name], c.arguments) for c in calls] == [favour]
    # the request's words reach the router's word expert: "timer" outweighs the state
    expert = words_for(tuple(names), {"timer": ("timer.cancel", "timer.cancel()")}, 10.0)
    gen.router = dataclasses.replace(gen.router, words=expert)
    items, _ = drain(gen.generate(convo, 32, lambda: False, TOOLS))
    assert [i.name for i in items if isinstance(i, ToolCall)] == ["timer.cancel"]
    # a router that speaks wins over a model whose first token would call
    backend = CallsFirst(tiny_diffusion(4), max_len=1024)
    backend.open_id = tok.encode_plain(CALL_OPEN)[0]  # type: ignore[attr-defined]
    gen.backend = gen.prefixes.backend = backend
    gen.router = a_router("timer.cancel()", backend.vocab_size, act=False, names=tuple(names))
    items, _ = drain(gen.generate(convo, 16, lambda: False, TOOLS))
    assert not any(isinstance(i, ToolCall) for i in items)
    # a session with a tool it does not know: where the router reads speech, the
    # model's first token decides, and its call carries no margin (a question may be a
    # call of the session's own lookup tool)
    other = [*TOOLS[:1], dataclasses.replace(TOOLS[0], name="doors.lock")]
    items, _ = drain(gen.generate(convo, 16, lambda: False, other))
    assert [i.margin for i in items if isinstance(i, ToolCall)] == [None]
    # where it is sure of an action, the session acts though the model's token speaks;
    # the model names the tool, and the call carries the router's margin
    gen.backend = gen.prefixes.backend = TorchBackend(tiny_diffusion(4), max_len=1024)
    gen.router = a_router("timer.cancel()", backend.vocab_size, names=tuple(names))
    items, _ = drain(gen.generate(convo, 16, lambda: False, other))
    assert [i.margin for i in items if isinstance(i, ToolCall)] == [5.0]
    gen.router.bias[:2] = (0.0, 2.9)  # unsure: the model's token (it speaks)
    items, _ = drain(gen.generate(convo, 16, lambda: False, other))
    assert not any(isinstance(i, ToolCall) for i in items)
    # a session with a part of its tools: it acts with the session's tool it reads,
    # and on a request for one the session lacks the user hears so, not its nearest
    gen.router = a_router("timer.cancel()", backend.vocab_size, names=tuple(names))
    part = [tools["timer.cancel"], tools["lights.set"]]
    items, _ = drain(gen.generate(convo, 16, lambda: False, part))
    assert [i.name for i in items if isinstance(i, ToolCall)] == ["timer.cancel"]
    items, _ = drain(gen.generate(convo, 16, lambda: False, [tools["lights.set"]]))
    assert items == [CANNOT_ACT]


def test_rows_are_asked_alone_or_after_others_as_a_session_keeps_them(tmp_path: Path) -> None:
    lines = [
        {"question": "timer off", "source": "command:timer.cancel",
         "reply": '<tool_call>{"name": "timer.cancel", "arguments": {}}</tool_call>Done.'},
        {"question": "hi", "source": "template", "reply": "Hello  there."},
        {"question": "how are timers made?", "source": "negative", "reply": "With care."},
        {"question": "ignored", "source": "elsewhere", "reply": "x"},
    ]  # fmt: skip
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    rows = read_rows(path)
    assert rows == [
        Row("timer off", "timer.cancel()", '<tool_call>{"name": "timer.cancel", '
            '"arguments": {}}</tool_call> Done.'),
        Row("hi", None, "Hello there."),
        Row("how are timers made?", None, "With care."),
    ]  # fmt: skip
    alone = conversations(rows, 0.0, seed=0)
    assert [[m.content for m in c] for c in alone] == [[r.text] for r in rows]
    after = conversations(rows, 1.0, seed=0)
    for row, convo in zip(rows, after, strict=True):
        assert convo[-1] == ChatMessage("user", row.text) and len(convo) in (3, 5)
        earlier = {(r.text, r.kept) for r in rows if r is not row}
        pairs = zip(convo[:-1:2], convo[1:-1:2], strict=True)
        assert all((u.content, a.content) in earlier for u, a in pairs)


def test_prefills_after_the_shared_system_prompt_give_each_prompt_s_own_logits() -> None:
    from model.backend import last_row
    from model.chat import build_prompt
    from model.tools import tools_system_prompt
    from training.router import prefill_logits

    gen, _ = tiny_generator()
    gen.backend = TorchBackend(tiny_diffusion(4), max_len=1024)
    convos = [
        [ChatMessage("user", "set a timer for 5 minutes")],
        [ChatMessage("user", "hi"), ChatMessage("assistant", "Hello."), ChatMessage("user", "x")],
        [ChatMessage("user", "lights off please")],
    ]
    got = prefill_logits(gen, convos, log=lambda _: None)
    system = tools_system_prompt(gen.options.system_prompt, DEFAULT_TOOLS)
    b = gen.backend
    for row, convo in zip(got, convos, strict=True):
        opts = gen.options
        prompt = build_prompt(gen.tokenizer, convo, opts.prompt_budget, system, opts.history_window)
        ids = np.asarray(prompt, np.int64)
        alone = b.step(b.new_cache(), ids, "causal", True, last_row(ids))[-1]
        np.testing.assert_allclose(row, alone, atol=1e-4)
