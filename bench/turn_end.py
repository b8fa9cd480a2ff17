"""Learned end of turn, measured: ``python -m bench.turn_end``.

    python -m bench.turn_end [--model-dir DIR] [--voices piper espeak] [--no-asr]
                                    [--window sized|full] [--cache DIR] [--repeats 30] [--tune]

The labelled set (:func:`labelled_set`, fixed and seeded): complete requests a voice
assistant hears (:data:`audio.speech.QUESTIONS` and :data:`COMPLETE`: timers,
navigation, music, messages, the home, lists, the calendar, questions, the glasses,
short answers) and incomplete ones, each request cut once at a natural pause point
(after a preposition, a conjunction, a comma, mid noun phrase, sometimes followed by
"um"). Requests are split in two halves by a seeded shuffle, a cut going with its
request: the thresholds were read off the tuning half (``--tune`` prints that sweep);
every other figure printed is on the held-out half.

Each utterance is scored in three forms: as written ("text"), and as Whisper tiny.en
transcribes it when Piper or espeak-ng says it ("piper", "espeak": what the session
really gets; Whisper writes "?" or "." on many cut-offs and often "that" for a final
"the"). Transcripts are cached in ``--cache``, per voice and encoder window.

Prints precision / recall / F1 of "complete" for the word heuristic, the model's
probability alone at each eagerness and the two combined (:class:`TurnEndPolicy`), the
end-of-turn silence each policy leaves complete and incomplete requests compared with
today's rule (416 ms, or 1200 ms for a transcript that looks unfinished; both after the
transcript is known), and the scorer's time per call (median of repeats: the machine
is shared, so compare only within a run). docs/results/2026-12-end-of-turn.md has a run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from audio.speech import QUESTIONS
from model.assemble import engine_model_dir
from model.modeldir import default_cache_dir
from server.turn_end import (
    EAGERNESS,
    EndOfTurnModel,
    TurnEndPolicy,
    TurnEndScores,
    looks_incomplete,
)

SEED = 21
# Requests beyond audio.speech.QUESTIONS, as a user says them (numbers in words: Piper
# reads what is written). Some end in a word the heuristic distrusts ("looking at?").
COMPLETE = (
    # timers and alarms
    "Set a timer for ten minutes.",
    "Set an alarm for six thirty tomorrow morning.",
    "Cancel my alarm.",
    "How much time is left on the timer?",
    "Wake me up at seven.",
    "Start a countdown for the pasta.",
    "Snooze the alarm for five minutes.",
    "Stop the timer.",
    "Set a reminder to water the plants every Sunday.",
    "Turn off all my alarms for the weekend.",
    # navigation and the car
    "Navigate to the nearest gas station.",
    "How long will it take to get home?",
    "Take me to the airport, avoiding tolls.",
    "Find a parking garage near the stadium.",
    "Is there traffic on the way to work?",
    "What's my estimated time of arrival?",
    "Find a coffee shop on my route.",
    "Where is the closest charging station?",
    "Show me directions to Grandma's house.",
    "How far is it to Chicago?",
    "Turn the air conditioning down a little.",
    "Open the sunroof.",
    "Which exit do I take?",
    "Reroute around the accident.",
    # music and media
    "Play some jazz.",
    "Skip this song.",
    "Turn the volume up.",
    "Play the next episode of my podcast.",
    "Who sings this song?",
    "Pause the music.",
    "Play my workout playlist on shuffle.",
    "Put on something relaxing for dinner.",
    "Play the latest album by Taylor Swift.",
    "Go back to the previous track.",
    "Add this song to my favorites.",
    "What's this song called?",
    "Resume the audiobook where I left off.",
    # messages and calls
    "Call my mom.",
    "Text Sarah that I'm running ten minutes late.",
    "Read my new messages.",
    "Send a message to the team saying the meeting is moved to three.",
    "Reply to John with thumbs up.",
    "Did anyone call while I was driving?",
    "Call the dentist's office.",
    "Send my location to Alex.",
    "Tell Maria I'll pick up the kids after school.",
    "Check my email.",
    "Hang up.",
    "Call back the last number.",
    # the home
    "Turn off the lights in the living room.",
    "Set the thermostat to seventy two degrees.",
    "Lock the front door.",
    "Is the garage door open?",
    "Dim the bedroom lights to thirty percent.",
    "Turn the lights on.",
    "Start the robot vacuum.",
    "Close the blinds in the kitchen.",
    "Turn on the porch light at sunset.",
    "What's the temperature inside?",
    # shopping and lists
    "What's on my shopping list?",
    "Remove bananas from the list.",
    "Order more paper towels.",
    "Add batteries to my list.",
    "Where is my package?",
    "Create a new list called camping trip.",
    # calendar and reminders
    "What's on my calendar today?",
    "Schedule a meeting with Dave on Friday at two.",
    "Remind me to take my medicine after lunch.",
    "When is my next appointment?",
    "Move my three o'clock meeting to four.",
    "Do I have anything tomorrow morning?",
    "Remind me to buy flowers when I leave work.",
    "Cancel my lunch with Priya.",
    "What day is Thanksgiving this year?",
    # weather
    "What's the weather like today?",
    "Will it rain this afternoon?",
    "Do I need an umbrella tomorrow?",
    "How cold is it outside?",
    "What's the forecast for the weekend?",
    "Is it going to snow in Denver on Saturday?",
    # facts and questions
    "Who was the first person to walk on the moon?",
    "How tall is Mount Everest?",
    "What's the population of Japan?",
    "When did the Second World War end?",
    "Why is the sky blue?",
    "How do you make pancakes?",
    "What does photosynthesis mean?",
    "How many ounces are in a cup?",
    "What's fifteen percent of eighty?",
    "Convert one hundred dollars to euros.",
    "What's the square root of one hundred forty four?",
    "Who won the game last night?",
    "What time is it in Tokyo?",
    "How do I say thank you in French?",
    "What's a good name for a golden retriever?",
    "Spell necessary.",
    "Tell me a joke.",
    "What are you looking at?",
    "Who is this song by?",
    "What is this made of?",
    "Where does this train go to?",
    # the glasses
    "Take a photo.",
    "Start recording a video.",
    "What am I looking at?",
    "Read this sign for me.",
    "Translate this menu into English.",
    "What kind of plant is this?",
    "How much does this cost in dollars?",
    "Remember where I parked.",
    "Who is calling?",
    # short turns
    "Yes.",
    "No, thanks.",
    "Stop.",
    "Never mind.",
    "Thank you.",
    "That's all.",
    "Repeat that, please.",
    "Louder.",
    "Sounds good.",
    "Go ahead.",
    # two clauses, lists, a leading clause
    "When I get home, turn on the heater.",
    "If it rains tomorrow, remind me to bring an umbrella.",
    "Before I forget, add coffee to the list.",
    "After the meeting, call Jim back.",
    "Turn off the TV and lock the doors.",
    "Text Amy and tell her I'm on my way.",
    "Is it cheaper to fly or take the train?",
    "Remind me to call Bob when I get home.",
    "Find a restaurant that's open late and serves pizza.",
    "Should I take the highway or the back roads?",
    "Tell me the news and then the weather.",
    "Order a taxi because I'm running late.",
    "Add apples, oranges, and grapes to the list.",
    "Play something upbeat, but not too loud.",
)


# Where a speaker pauses mid-request. Cut after one of these words, the request cannot
# be over; "this", "that", "last", "first" are left out: "What's this?" is complete.
def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_PREPOSITIONS = _words(
    "in on at to for from with about of into near by after before around without over "
    "under through between"
)
_CONJUNCTIONS = _words("and or but because if so when while than until unless")
# a determiner or an adjective still waiting for its noun
_NOUN_PHRASE = _words(
    "the a an my your his her our their some any every next nearest closest latest previous"
)
_SUBORDINATORS = _words("if when before after once while")


@dataclass(frozen=True)
class Example:
    text: str  # as written (and as Piper / espeak-ng say it)
    complete: bool
    kind: str  # "complete", or where it was cut: "preposition", "comma + um", ...
    request: int  # the request it is (cut from)
    held_out: bool


def cut_points(request: str) -> list[tuple[str, int]]:
    """``(kind, n)``: the request's first ``n`` words stop at a pause point of ``kind``.
    At least two words; a comma only where what comes before cannot stand alone (after
    a leading "If ...", inside a list)."""
    words = request.split()
    listed = ", and" in request or ", or" in request
    out = []
    for n, word in enumerate(words[:-1], 1):
        bare = re.sub(r"[^a-z']", "", word.lower())
        if n < 2:
            continue
        if word.endswith(","):
            lead = words[0].lower().strip(",") in _SUBORDINATORS
            if lead or (listed and n < len(words) - 2):
                out.append(("comma", n))
        elif bare in _PREPOSITIONS:
            out.append(("preposition", n))
        elif bare in _CONJUNCTIONS:
            out.append(("conjunction", n))
        elif bare in _NOUN_PHRASE:
            out.append(("noun phrase", n))
    return out


# Words a request often goes on with after a part that could stand alone: "Remind me
# to call my mother | at seven thirty tonight", "How far is it from here | to the
# nearest gas station?", "Play some relaxing music | , but not too loud".
_GOES_ON = _PREPOSITIONS | _CONJUNCTIONS | _words("please tonight tomorrow today now saying every")


def paused_prefixes(seed: int = SEED) -> list[Example]:
    """The other place to pause mid-request: before the part that completes it, where
    the words so far often read as a finished request ("Remind me to call my mother"
    0.75 s "at seven thirty tonight."; :func:`labelled_set` cuts after a preposition or
    an article instead). Every prefix of :func:`labelled_set`'s requests of at least
    three words that stops right before a word of :data:`_GOES_ON` and that the word
    heuristic does not call unfinished, each text once; labelled incomplete (the user
    goes on), kind "before more", in the same halves as their requests. Many cannot be
    told from a finished request by their words: the set measures how often a policy
    answers into such a pause, which is what the 200 ms path risks."""
    held = {e.request: e.held_out for e in labelled_set(seed) if e.complete}
    out: dict[str, Example] = {}
    for i, request in enumerate(_requests()):
        words = request.split()
        for n in range(3, len(words)):
            prefix = " ".join(words[:n]).rstrip(",")
            goes_on = re.sub(r"[^a-z']", "", words[n].lower()) in _GOES_ON
            if goes_on and not looks_incomplete(prefix) and prefix not in out:
                out[prefix] = Example(prefix, False, "before more", i, held[i])
    return list(out.values())


def _requests() -> list[str]:
    return list(dict.fromkeys([*QUESTIONS, *COMPLETE]))


def labelled_set(seed: int = SEED) -> list[Example]:
    """Every request complete, then one cut of each that has a pause point: the kind
    drawn first (a comma when there is one, half the time), then the point (the last
    of that kind half the time); a fifth of the cuts end in "um"."""
    rng = random.Random(seed)
    requests = _requests()
    order = list(range(len(requests)))
    rng.shuffle(order)
    held = {r for k, r in enumerate(order) if k % 2}
    out = [Example(q, True, "complete", i, i in held) for i, q in enumerate(requests)]
    for i, request in enumerate(requests):
        points = cut_points(request)
        if not points:
            continue
        kinds = sorted({k for k, _ in points})
        comma = "comma" in kinds and rng.random() < 0.5
        kind = "comma" if comma else rng.choice(kinds)
        at = [p for p in points if p[0] == kind]
        _, n = at[-1] if rng.random() < 0.5 else rng.choice(at)
        text = " ".join(request.split()[:n])
        if rng.random() < 0.2:
            text, kind = text.rstrip(",") + ", um", kind + " + um"
        out.append(Example(text, False, kind, i, i in held))
    return out


# -- the forms a transcript takes -----------------------------------------------------


def transcribe_set(
    examples: Sequence[Example], voice: str, cache: Path | None, window: str | None = None
) -> tuple[dict[str, str], str]:
    """Whisper tiny.en's transcript of each example as ``voice`` (piper, espeak) says
    it with 0.3 s of silence around it, from the transcriber as the server loads it
    (``window``: its encoder window, "sized" or "full", None: its default); cached as
    JSON in ``cache``, a file per voice and window (the two punctuate differently,
    docs/results/2026-12-end-of-turn.md). Returns the transcripts and the window."""
    from audio.asr import AsrOptions, load_transcriber
    from audio.speech import SpeechFactory

    options: dict[str, Any] = {"window": window} if window else {}
    asr = load_transcriber("tiny.en", options=AsrOptions(**options))
    window = getattr(asr, "window", "full")  # a transcriber without the sized window: full
    path = cache / f"transcripts-{voice}-tiny.en-{window}.json" if cache else None
    known: dict[str, str] = json.loads(path.read_text()) if path and path.is_file() else {}
    todo = [e.text for e in examples if e.text not in known]
    if todo:
        if cache:
            (cache / "speech").mkdir(parents=True, exist_ok=True)
        speech = SpeechFactory(cache / "speech" if cache else None)
        say = speech.piper if voice == "piper" else speech.espeak
        for text in todo:
            known[text] = asr.transcribe(say(text, 0.3, 0.3)).text
        if path:
            path.write_text(json.dumps(known, indent=1, sort_keys=True))
    return {e.text: known[e.text] for e in examples}, window


@dataclass(frozen=True)
class Scored:
    example: Example
    form: str  # "text", "piper", "espeak"
    transcript: str
    scores: TurnEndScores


def score_forms(
    model: EndOfTurnModel, examples: Sequence[Example], forms: dict[str, dict[str, str]]
) -> list[Scored]:
    out = []
    for form, transcripts in forms.items():
        for e in examples:
            t = transcripts[e.text]
            out.append(Scored(e, form, t, model.scores(t)))
    return out


# -- metrics --------------------------------------------------------------------------


@dataclass(frozen=True)
class Prf:
    precision: float
    recall: float
    f1: float
    n: int  # predicted complete

    def row(self) -> str:
        return f"{self.precision:.2f} | {self.recall:.2f} | {self.f1:.2f}"


def prf(pairs: Iterable[tuple[bool, bool]]) -> Prf:
    """Precision, recall, F1 of "complete" over ``(predicted, truth)`` pairs."""
    tp = fp = fn = 0
    for pred, truth in pairs:
        tp += pred and truth
        fp += pred and not truth
        fn += truth and not pred
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    return Prf(p, r, 2 * p * r / (p + r) if p + r else 0.0, tp + fp)


def lm_only(policy: TurnEndPolicy) -> TurnEndPolicy:
    return replace(policy, use_words=False)


Method = tuple[str, Callable[[Scored], bool]]  # a name, "predicts complete"


def methods() -> list[Method]:
    """The deciders compared: words alone (today: complete = answered at 416 ms), the
    probability alone and combined with the words at each eagerness (complete = the
    200 ms path), and the plain P(<|im_end|>) reading at the medium threshold."""
    out: list[Method] = [("words alone (today)", lambda s: not looks_incomplete(s.transcript))]
    for e, policy in EAGERNESS.items():
        lm = lm_only(policy)
        out.append((f"P(complete) >= {policy.complete_at:g} ({e})", _fast(lm)))
    for e, policy in EAGERNESS.items():
        out.append((f"combined, {e}", _fast(policy)))
    t = EAGERNESS["medium"].complete_at
    out.append((f"P(<|im_end|>) as written >= {t:g}", lambda s: s.scores.end_token >= t))
    return out


def _fast(policy: TurnEndPolicy) -> Callable[[Scored], bool]:
    return lambda s: policy.tier(s.transcript, s.scores.complete) == "complete"


def auc(scored: Sequence[Scored], key: Callable[[Scored], float]) -> float:
    """P(a complete request scores above an incomplete one), ties half: how well a
    score ranks, whatever threshold is put on it (files on different scales compare)."""
    done = [key(s) for s in scored if s.example.complete]
    cut = [key(s) for s in scored if not s.example.complete]
    wins = sum((a > b) + 0.5 * (a == b) for a in done for b in cut)
    return wins / (len(done) * len(cut))


def print_auc(scored: Sequence[Scored], forms: Sequence[str]) -> None:
    print("\n## Held-out: ranking (AUC) of each reading\n")
    print("| reading | " + " | ".join(forms) + " |")
    print("|---|" + "---|" * len(forms))
    readings: list[tuple[str, Callable[[Scored], float]]] = [
        ("P(complete): the words, final punctuation removed", lambda s: s.scores.complete),
        ("P(<|im_end|>): the transcript as written", lambda s: s.scores.end_token),
    ]
    for name, key in readings:
        cells = [f"{auc([s for s in scored if s.form == f], key):.3f}" for f in forms]
        print(f"| {name} | " + " | ".join(cells) + " |")


def print_prf(scored: Sequence[Scored], forms: Sequence[str]) -> None:
    print("\n## Held-out: precision / recall / F1 of 'complete'\n")
    print("| decider | " + " | ".join(f"{f}: P | R | F1" for f in forms) + " |")
    print("|---|" + "---|---|---|" * len(forms))
    for name, predict in methods():
        cells = [
            prf((predict(s), s.example.complete) for s in scored if s.form == f).row()
            for f in forms
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


# -- when each turn is final ----------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """When the transcript (and its score) is known, in ms of silence after speech."""

    pause_ms: float = 192.0  # the speculative final ASR starts here (EndpointConfig)
    asr_ms: float = 50.0
    score_ms: float = 0.0


Rule = Callable[[Scored], float]  # the silence a turn needs once its transcript is in


def today(s: Scored) -> float:
    """Today's session: 416 ms, or 1200 ms when the words look unfinished."""
    return 1200.0 if s.transcript.strip() and looks_incomplete(s.transcript) else 416.0


def rules() -> list[tuple[str, Rule, bool, float]]:
    """``(name, rule, needs the score, its hold)``: today's and each eagerness's."""
    out: list[tuple[str, Rule, bool, float]] = [("today", today, False, 1200.0)]
    for e, policy in EAGERNESS.items():

        def rule(s: Scored, policy: TurnEndPolicy = policy) -> float:
            return policy.silence_needed_ms(s.transcript, s.scores.complete)

        name = f"{e} (unsure {policy.unsure_ms:.0f}, hold {policy.hold_ms:.0f})"
        out.append((name, rule, True, policy.hold_ms))
    return out


def paths(rule: Rule, scored: Iterable[Scored], hold_ms: float) -> str:
    """How many turns take each path, "200 / 416 / unsure / held": the 200 ms path,
    the endpointer's 416 ms, the unsure wait (past 416 ms, short of the hold), a hold."""
    counts = Counter(
        0 if x <= 200 else 1 if x <= 416 else 2 if x < hold_ms else 3 for x in map(rule, scored)
    )
    return " / ".join(str(counts[k]) for k in range(4))


def print_latency(scored: Sequence[Scored], timings: Sequence[Timing]) -> None:
    """Per rule: the silence after which complete requests are final (median, mean;
    saved against today), with the transcript, and for a policy its score, known
    only at ``pause + ASR + score``; and how many requests of each kind take each path."""
    asr = [s for s in scored if s.form != "text"]
    done = [s for s in asr if s.example.complete]
    cut = [s for s in asr if not s.example.complete]
    print(
        f"\n## Held-out, ASR forms ({len(done)} complete, {len(cut)} incomplete): silence "
        "before the turn is final\n"
    )
    print(
        "| rule | transcript + score known at (ms) | complete: final at, median (mean) "
        "| saved, median (mean) | complete: 200 / 416 / unsure / held "
        "| incomplete: 200 / 416 / unsure / held |"
    )
    print("|---|---|---|---|---|---|")
    for t in timings:
        base = [max(today(s), t.pause_ms + t.asr_ms) for s in done]
        for name, rule, scored_, hold_ms in rules():
            score_ms = t.score_ms if scored_ else 0.0
            ready = t.pause_ms + t.asr_ms + score_ms
            new = [max(rule(s), ready) for s in done]
            saved = [b - n for b, n in zip(base, new, strict=True)]
            print(
                f"| {name} | {t.pause_ms:.0f} + {t.asr_ms:.0f} + {score_ms:.0f} "
                f"| {statistics.median(new):.0f} ({statistics.mean(new):.0f}) "
                f"| {statistics.median(saved):.0f} ({statistics.mean(saved):.0f}) "
                f"| {paths(rule, done, hold_ms)} | {paths(rule, cut, hold_ms)} |"
            )


# -- tuning ---------------------------------------------------------------------------

GRID = (0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7)


def print_sweep(scored: Sequence[Scored]) -> None:
    """The tuning half (ASR forms): how many requests reach P(complete) >= t, alone and
    with the words' veto; the EAGERNESS thresholds were read off this table."""
    pool = [s for s in scored if s.form != "text" and not s.example.held_out]
    done = [s for s in pool if s.example.complete]
    cut = [s for s in pool if not s.example.complete]
    print(
        f"\n## Tuning half, ASR forms ({len(done)} complete, {len(cut)} incomplete): "
        "P(complete) >= t\n"
    )
    print(
        "| t | complete | incomplete | precision | with the words' veto: complete "
        "| incomplete | precision |"
    )
    print("|---|---|---|---|---|---|---|")
    for t in GRID:
        cells = []
        for veto in (False, True):

            def ok(s: Scored, t: float = t, veto: bool = veto) -> bool:
                return s.scores.complete >= t and not (veto and looks_incomplete(s.transcript))

            a, b = sum(map(ok, done)), sum(map(ok, cut))
            cells.append(f"{a / len(done):.0%} | {b / len(cut):.0%} | {a / max(1, a + b):.2f}")
        print(f"| {t:g} | " + " | ".join(cells) + " |")


PATH_GRID = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def print_prefix_sweep(scored: Sequence[Scored], prefixes: Sequence[Scored]) -> None:
    """Per half, as Whisper hears them: the share of complete requests that take the
    200 ms path at ``complete_at`` = t (medium otherwise), against the share of
    :func:`paused_prefixes` that do, each a reply started into a pause before the
    rest of the request. medium's ``complete_at`` is read off the tuning half."""
    print(
        "\n## The 200 ms path against pauses before the rest of a request (ASR forms): "
        "share of each that takes it at complete_at = t\n"
    )
    print(
        "| t | tuning: complete | tuning: before more "
        "| held-out: complete | held-out: before more |"
    )
    print("|---|---|---|---|---|")
    for t in PATH_GRID:
        fast = _fast(replace(EAGERNESS["medium"], complete_at=t))
        cells = []
        for held in (False, True):
            for pool in (scored, prefixes):
                rows = [
                    s
                    for s in pool
                    if s.form != "text"
                    and s.example.held_out == held
                    and (s.example.complete or s.example.kind == "before more")
                ]
                hit = sum(map(fast, rows))
                cells.append(f"{hit / max(1, len(rows)):.0%} ({hit}/{len(rows)})")
        print(f"| {t:g} | " + " | ".join(cells) + " |")


# -- cost -----------------------------------------------------------------------------


def time_scorer(model: EndOfTurnModel, texts: Sequence[str], repeats: int) -> float:
    """Median ms per call over ``repeats`` passes of ``texts``."""
    model.probability(texts[0])  # warm-up
    times = []
    for _ in range(repeats):
        for text in texts:
            t0 = time.perf_counter()
            model.probability(text)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def ending(text: str) -> str:
    """How a transcript ends: "...", ".", "?", "!", or "none"."""
    t = text.rstrip()
    if t.endswith(("...", "\u2026")):
        return "..."
    return t[-1] if t[-1:] in (".", "?", "!") else "none"


def endings(texts: Iterable[str]) -> str:
    counts = Counter(ending(t) for t in texts)
    return ", ".join(f'"{k}" {n}' for k, n in counts.most_common())


def partial_endings(cache: Path | None, window: str | None, fraction: float = 0.6) -> str:
    """How Whisper ends a partial transcript: the first ``fraction`` of each test
    question's audio (Piper), cut mid-speech as the session's partials are."""
    from audio.asr import AsrOptions, load_transcriber
    from audio.speech import SpeechFactory

    options: dict[str, Any] = {"window": window} if window else {}
    asr = load_transcriber("tiny.en", options=AsrOptions(**options))
    speech = SpeechFactory(cache / "speech" if cache else None)
    texts = []
    for q in QUESTIONS:
        audio = speech.piper(q, 0.3)
        texts.append(asr.transcribe(audio[: int(len(audio) * fraction)]).text)
    return endings(texts)


def print_endings(scored: Sequence[Scored]) -> None:
    print("\n## How the transcripts end (whole set)\n")
    for form in sorted({s.form for s in scored} - {"text"}):
        for done in (True, False):
            ts = [s.transcript for s in scored if s.form == form and s.example.complete is done]
            print(f"- {form}, {'complete' if done else 'incomplete'}: {endings(ts)}")


# -- main -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model-dir", type=Path, help="exported model (default: the served one)")
    ap.add_argument("--voices", nargs="*", default=["piper", "espeak"])
    ap.add_argument("--no-asr", action="store_true", help="the written form only")
    ap.add_argument("--window", choices=["sized", "full"], help="Whisper's encoder window")
    ap.add_argument("--cache", type=Path, default=default_cache_dir() / "bench" / "turn_end")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--tune", action="store_true", help="print the tuning half's sweep")
    args = ap.parse_args(argv)
    from audio.speech import have_espeak

    model_dir = args.model_dir or engine_model_dir("diffusion-onnx")
    model = EndOfTurnModel.from_model_dir(model_dir)
    examples = labelled_set()
    n_done = sum(e.complete for e in examples)
    held = [e for e in examples if e.held_out]
    print(f"# End of turn: {model_dir.name}, int8, 1 thread")
    print(
        f"labelled set: {n_done} complete, {len(examples) - n_done} incomplete; "
        f"held-out {sum(e.complete for e in held)} / {sum(not e.complete for e in held)}"
    )
    forms = {"text": {e.text: e.text for e in examples}}
    voices = [] if args.no_asr else [v for v in args.voices if v != "espeak" or have_espeak()]
    args.cache.mkdir(parents=True, exist_ok=True)
    for v in voices:
        forms[v], window = transcribe_set(examples, v, args.cache, args.window)
        print(f"{v}: Whisper tiny.en, {window} encoder window")
    scored = score_forms(model, examples, forms)
    if args.tune:
        print_sweep(scored)
    if voices:
        before_more = paused_prefixes()
        heard = {v: transcribe_set(before_more, v, args.cache, args.window)[0] for v in voices}
        print_prefix_sweep(scored, score_forms(model, before_more, heard))
    test = [s for s in scored if s.example.held_out]
    print_auc(test, list(forms))
    print_prf(test, list(forms))
    ms = time_scorer(model, [e.text for e in held[:10]], args.repeats)
    load = os.getloadavg()[0]
    if voices:
        print_latency(test, [Timing(asr_ms=0.0, score_ms=0.0), Timing(score_ms=ms)])
        print_endings(scored)
        print(
            f"partial transcripts (first 60% of each test question, Piper): "
            f"{partial_endings(args.cache, args.window)}"
        )
    print(
        f"\nscorer: {ms:.1f} ms per call (median of {args.repeats} x 10 held-out texts, "
        f"1 thread; load average {load:.1f} on {os.cpu_count()} cores: a shared machine)"
    )


if __name__ == "__main__":
    main()
