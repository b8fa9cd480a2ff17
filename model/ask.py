"""Asking before acting: the user's yes or no to a question, and calls that name
someone by a reference to an earlier call.

A tool marked ``confirm`` (``model.tools.Tool``) is asked about before its call is
made ("Send 'I'm running late' to your sister?", ``model.confirm.question``); the
user's next words answer it. :func:`answer` reads them: a plain yes or no, said alone
(with "please" or "thanks" around it), and nothing else: "No, call my brother" is a new
request, not a no, and is answered as one.

A call's string argument that names someone may be a reference ("text her instead"):
:func:`resolve` puts in the name the conversation's latest earlier call gave ("my
sister" from ``call.start {contact: "my sister"}``), or says whom to ask about when no
earlier call named anyone: the call is then *incomplete* (:func:`missing`), that
parameter dropped, and the name the user answers fills it in (:func:`named`). A
number the call needs and the request did not say (the model wrote one: "Set a timer."
-> ``seconds: 100``; "bring the cabin to sixteen degrees" heard "... to 60 degrees",
outside the tool's range) is dropped the same way (:func:`unsaid`) and asked for ("For
how long?", "What temperature?"): a number is the user's, never the model's guess.

Before any of that, whether to act at all (:func:`unheard`, :func:`outside`,
:func:`claims`, :func:`asked`): a call on words the ASR was unsure of is not made
("Sorry, I didn't catch that."); a call whose arguments do not come from the request
as a command's do ("Read me my last message." -> ``message.send {to: "me"}``), or a
reply that claims an action no call made, answers a request no tool does, and is
refused ("Sorry, I can't do that."); a call the router was unsure to make is asked
about. All pure: the turn pipeline and the session read the same words the same way
(server/turn.py, server/session.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Literal

from model.engine import ChatMessage
from model.router import SURE
from model.spoken import (
    UNIT_PARAMS,
    is_number_word,
    slot_value,
    spoken_duration,
    spoken_numbers,
)
from model.tools import VALUE_WORDS, Param, Tool, ToolCall, is_default, split_call

Answer = Literal["yes", "no"]
DECLINED = "Okay, I won't."  # said to a no: the call asked about is dropped
NOT_CAUGHT = "Sorry, I didn't catch that. Could you say it again?"  # unsure words: no call
CANT = "Sorry, I can't do that."  # a request no tool does: never the nearest tool

# How sure the words must be to act on (Whisper's per-segment figures, audio.asr's
# Transcript: the lowest average log-probability, the highest no-speech probability).
# faster-whisper's own bars: below log_prob_threshold -1.0 it deems a decode failed
# (and retries it hotter), above no_speech_threshold 0.6 it may be no speech at all.
# Each bar alone stops a call (faster-whisper needs both to skip a window as silence):
# words outside either are answered, never acted on.
LOG_PROB_BAR = -1.0
NO_SPEECH_BAR = 0.6
# How sure the router must be that the request asks for an action (its log-odds,
# ToolCall.margin): the router decides alone at |log-odds| >= 3 (model.router.SURE,
# probability 0.95); below that the model's first token decides, and a call it makes
# so is asked about ("Set a timer for ten minutes?") instead of made. On the typed
# held-out set 239 of the 240 commands' calls clear it, median 34; "a little louder"
# (0.2) is asked about (docs/actions.md).
SURE_TO_ACT = SURE
# what names the user or the assistant, never whom a message or call goes to
_SELF = frozenset(["me", "myself", "you", "yourself", "us", "ourselves", "i"])

_YES = frozenset(
    [
        "yes",
        "yeah",
        "yea",
        "yep",
        "yup",
        "sure",
        "ok",
        "okay",
        "do it",
        "do that",
        "please do",
        "yes please",
        "send it",
        "call",
        "call them",
        "go ahead",
        "go for it",
        "correct",
        "right",
        "that's right",
        "absolutely",
        "of course",
        "sounds good",
        "sure thing",
        "yes do it",
        "yes send it",
        "yes go ahead",
    ]
)
_NO = frozenset(
    [
        "no",
        "nope",
        "nah",
        "don't",
        "do not",
        "no don't",
        "don't do it",
        "don't send it",
        "don't call",
        "cancel",
        "cancel it",
        "cancel that",
        "never mind",
        "nevermind",
        "forget it",
        "stop",
        "no thanks",
        "no thank you",
        "not now",
    ]
)
_POLITE = frozenset(["please", "thanks", "thank you", "um", "uh", "oh", "well"])
_CLAUSES = re.compile(r"[.,!?;:\u2026]+")
_SPACES = re.compile(r"\s+")

# Who a call goes to, by parameter: where a reference ("her") names someone
_WHO = {
    "to": "Who should I send it to?",
    "contact": "Who should I call?",
    "recipient": "Who should I send it to?",
}
_REFERENCE = re.compile(
    r"^(her|him|them|they|it|that person|this person|the same person|that one|that contact)"
    r"(\s+instead)?[.!?]?$",
    re.I,
)
_INSTEAD = re.compile(r"\s+instead[.!?]?$", re.I)
# A number a call needs, by parameter (others: "What level?")
_NUMBER_QUESTIONS = {
    **dict.fromkeys(UNIT_PARAMS, "For how long?"),
    "temperature_c": "What temperature?",
}


def answer(text: str) -> Answer | None:
    """ "yes", "no", or None for anything else (a new request, or both at once)."""
    clauses = [_SPACES.sub(" ", c).strip() for c in _CLAUSES.split(text.lower())]
    clauses = [c.replace("\u2019", "'") for c in clauses if c]
    said = {c for c in clauses if c not in _POLITE}
    if not said:
        return None
    if said <= _YES:
        return "yes"
    if said <= _NO:
        return "no"
    return None


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


def statement(text: str) -> bool:
    """The words tell rather than ask: every clause is a report of what happened ("I
    called my mom yesterday.", "That timer went off too early.") or an opinion of
    something ("The lights in this city are beautiful."): a subject first, then a verb
    in the past tense, or "is"/"are" and an adjective of taste. Asked so, nothing is for
    a tool to do; the reply is a chat reply (server/turn.py offers it no tools). A
    clause that begins with a verb ("Text Sam that I was late."), asks ("Can you ..."),
    wants ("I want ...", "I'd like ...") or states a need ("It's too dark in here.") is
    not a report. None of the project's 2,880 commands (data/actions) is one
    (tests/model/test_ask.py)."""
    clauses = [_split_words(c) for c in _CLAUSES.split(text.lower().replace("\u2019", "'"))]
    clauses = [c for c in clauses if c and not (len(c) == 1 and c[0] in _POLITE)]
    return bool(clauses) and all(_tells(c) for c in clauses)


def offered(tools: Sequence[Tool], text: str) -> tuple[Tool, ...]:
    """The tools a turn's words may call: none of the default ones where the words tell
    rather than ask (:func:`statement`). A session's own tools stay: "I called my mom
    yesterday." may be just what its call log is for."""
    if not statement(text):
        return tuple(tools)
    return tuple(t for t in tools if not is_default(t))


def _split_words(clause: str) -> list[str]:
    """A clause's words, contractions apart: "it's" -> "it", "'s"; "don't" -> "do", "n't"."""
    out = []
    for w in _WORDS.findall(clause):
        cut = len(w) - 3 if w.endswith("n't") else w.find("'")
        out += [w[:cut], w[cut:]] if cut > 0 else [w]
    return out


def _tells(words: list[str]) -> bool:
    """One clause's words (lower case) are a report or an opinion (:func:`statement`)."""
    if words[0] not in _SUBJECTS:
        return False
    for i, w in enumerate(words[1:6], 1):  # the clause's first verb, within a few words
        if w in _PAST:
            return True
        if w in ("is", "are", "'s", "'re"):
            return any(a in _TASTE for a in words[i + 1 : i + 4])
        if w in _ASKING:
            return False
    return False


# What a report or an opinion starts with: a pronoun or a determiner (never a verb)
_SUBJECTS = _word_set(
    "i we he she they it that this these those the my our his her their its someone "
    "somebody everyone mom dad"
)
# Verbs in the past tense a report's subject is followed by (none is a present form)
_PAST = _word_set(
    "was were went did had called sent texted played turned got came said told made "
    "left took saw heard forgot missed liked loved watched listened rang phoned "
    "wrote bought ate drove arrived finished started stopped ended happened broke "
    "fell woke slept met visited tried asked looked sounded seemed"
)
# Adjectives of taste: an opinion, not a need ("too loud", "dark" and "cold" are needs)
_TASTE = _word_set(
    "beautiful nice pretty great lovely amazing awesome wonderful fantastic gorgeous "
    "good fun funny interesting perfect cute charming"
)
# A verb that asks or wants, before any report ("I want ...", "we need ...")
_ASKING = _word_set(
    "want need would will can could should shall must let like wish have am please do 'd 'll 'm 've"
)


def earlier_calls(history: Iterable[ChatMessage]) -> list[ToolCall]:
    """The calls the conversation's replies made, oldest first (a reply is kept as its
    call's text, then its words: ``model.tools.kept_reply``)."""
    calls = []
    for message in history:
        if message.role == "assistant":
            call, _ = split_call(message.content)
            if call is not None:
                calls.append(call)
    return calls


def resolve(call: ToolCall, tool: Tool, earlier: Sequence[ToolCall]) -> ToolCall:
    """``call`` with a reference in a parameter that names someone (``to``,
    ``contact``, ``recipient``) replaced by the name the latest of the ``earlier``
    calls gave; dropped when none did, so that the call is incomplete
    (:func:`missing` says whom to ask about). A name that is no reference keeps its
    words, a trailing "instead" dropped."""
    args = dict(call.arguments)
    for p in tool.params:
        value = args.get(p.name)
        if p.name not in _WHO or not isinstance(value, str):
            continue
        if _REFERENCE.match(value.strip()) is None:
            args[p.name] = _INSTEAD.sub("", value.strip()) or value
            continue
        named = _named(earlier)
        if named is None:
            del args[p.name]
        else:
            args[p.name] = named
    return replace(call, arguments=args)


def unsaid(call: ToolCall, tool: Tool, text: str | None) -> ToolCall:
    """``call`` without the required numbers its request (``text``; None: not known)
    did not say: a value is said when it is a number of the request ("nineteen
    degrees", "19"), or for a parameter named for a unit its duration ("half an hour"
    is ``seconds: 1800``), and inside the parameter's ``minimum`` / ``maximum``. The
    call is then incomplete and :func:`missing` asks for the number; or, where the one
    number said is a "-ty" the parameter's bounds refuse and its "-teen" twin fits
    them (:func:`teen_twin`), the call takes the twin and is asked about
    (``doubted``): "Set the temperature to sixteen degrees?"."""
    if text is None:
        return call
    args, doubted = dict(call.arguments), call.doubted
    for p in tool.params:
        value = args.get(p.name)
        if _asks_number(p) and isinstance(value, int | float) and not _said(p, value, text):
            twin = teen_twin(p, text)
            if twin is None:
                del args[p.name]
            else:
                args[p.name], doubted = twin, True
    return replace(call, arguments=args, doubted=doubted)


def teen_twin(p: Param, text: str) -> int | None:
    """The "-teen" number a "-ty" one said in ``text`` may have been: Whisper hears
    "sixteen degrees" as "60 degrees" (three of the spoken eval's six hearings of
    "bring the cabin to sixteen degrees"), the two differing in one unstressed
    syllable. Only where the one number said is a whole ten from thirty to ninety
    outside ``p``'s bounds and its twin (13-19) inside them: a number that fits is
    taken as said, and a twin that does not fit either is no better a guess. None
    otherwise."""
    said = set(spoken_numbers(text))
    if len(said) != 1:
        return None
    (n,) = said
    if not (n.is_integer() and 30 <= n <= 90 and n % 10 == 0):
        return None
    twin = int(n) // 10 + 10
    return twin if p.within(twin) and not p.within(n) else None


def _asks_number(p: Param) -> bool:
    return p.required and p.type in ("integer", "number") and not p.enum


def _said(p: Param, value: float, text: str) -> bool:
    if not p.within(value):
        return False
    said = spoken_numbers(text)
    if p.name in UNIT_PARAMS and (seconds := spoken_duration(text)) is not None:
        said.append(seconds / UNIT_PARAMS[p.name])
    return any(abs(v - value) < 1e-6 for v in said)


def missing(call: ToolCall, tool: Tool) -> str | None:
    """What to ask ("Who should I call?", "For how long?") when ``call`` lacks whom
    it is for (a reference :func:`resolve` could not resolve) or a number its request
    did not say (:func:`unsaid`); None when it is complete."""
    for p in tool.params:
        if not p.required or p.name in call.arguments:
            continue
        if p.name in _WHO:
            return _WHO[p.name]
        if _asks_number(p):
            return _NUMBER_QUESTIONS.get(p.name, f"What {p.name.replace('_', ' ')}?")
    return None


def unheard(avg_logprob: float | None, no_speech_prob: float | None) -> bool:
    """The ASR was too unsure of the words to act on them (:data:`LOG_PROB_BAR`,
    :data:`NO_SPEECH_BAR`); typed words (None) are always heard."""
    if avg_logprob is not None and avg_logprob < LOG_PROB_BAR:
        return True
    return no_speech_prob is not None and no_speech_prob > NO_SPEECH_BAR


def outside(call: ToolCall, tool: Tool, text: str | None = None) -> bool:
    """``call`` is the nearest tool to a request no tool does, not what was asked:

    * whom it is for is the user or the assistant ("Read me my last message." ->
      ``message.send {to: "me"}``; "Wake me up in two hours." heard "... into hours"
      -> ``call.start {contact: "me up into hours"}``; "Translate thank you into
      Spanish." -> ``message.send {to: "you"}``);
    * two of its strings are one inside the other, or one is the whole request
      (``text``, where known): the request had no separate part that asked for the
      tool ("Read my messages." -> ``message.send {to: "my messages", text: "Read my
      messages"}``; "Thanks, goodbye." -> ``{to: "goodbye", text: "goodbye"}``;
      "Goodbye." -> ``call.start {contact: "Goodbye"}``);
    * a default tool with no words of the request among its arguments (none, a
      boolean, a level or an enum), whose own words the request (``text``, where
      known) does not have: nothing in it ties the call to the tool ("Okay, that's
      all for now." -> ``media.next``; "Lock the doors." -> ``lights.set {on:
      false}``).

    None holds for any of the project's own commands (the 2,880 of data/actions,
    trained and held out: tests/model/test_ask.py)."""
    strings = [v.lower().strip() for v in call.arguments.values() if isinstance(v, str)]
    for p in tool.params:
        value = call.arguments.get(p.name)
        if p.name in _WHO and isinstance(value, str):
            words = _WORDS.findall(value.lower())
            if words and words[0] in _SELF:
                return True
    if any(a in b for i, a in enumerate(strings) for j, b in enumerate(strings) if i != j and a):
        return True
    request = _WORDS.findall(text.lower()) if text is not None else None
    if request and any(_WORDS.findall(v) == request for v in strings):
        return True
    said = _TOOL_WORDS.get(tool.name)
    if said is None or text is None or not is_default(tool):
        return False
    return said.search(text.lower()) is None


def heard_alike(call: ToolCall, tool: Tool, first: str, again: str) -> bool:
    """Whether a second hearing of the user's words (``again``, another Whisper model:
    server/turn.py) asks for ``call`` as the first hearing (``first``) did. Two models
    rarely mishear a turn the same way; they often differ where it does not matter
    ("Uh, get rid of the timer." and "Get rid of the timer."). So: words that hold
    every one of the call's strings the first hearing held (its words in order,
    numbers aside), the same numbers (:func:`model.spoken.spoken_numbers`),
    a volume's direction in both (:data:`model.tools.VALUE_WORDS`), and nothing :func:`outside`
    finds (a tool that copies no words needs its own: "timer", "lights", ...)."""
    if not _WORDS.findall(again.lower()):
        return False
    heard, other = _unnumbered(first), _unnumbered(again)
    for value in call.arguments.values():
        words = _unnumbered(value) if isinstance(value, str) else []
        if words and _within(words, heard) and not _within(words, other):
            return False
    if spoken_numbers(first) != spoken_numbers(again):
        return False
    for name, value in call.arguments.items():
        said = VALUE_WORDS.get((call.name, name, value))
        if said is not None and not (said.search(first.lower()) and said.search(again.lower())):
            return False
    return not outside(call, tool, again)


def _unnumbered(text: str) -> list[str]:
    """``text``'s words, lowercased, without its number words and digits."""
    words = _WORDS.findall(text.lower().replace("-", " "))
    return [w for w in words if not is_number_word(w)]


def _within(part: Sequence[str], whole: Sequence[str]) -> bool:
    """``part`` is a run of ``whole``'s words."""
    n = len(part)
    return any(list(whole[i : i + n]) == list(part) for i in range(len(whole) - n + 1))


# The words each default tool that copies none of the request's words is asked for
# by: every one of their 1,200 commands in data/actions has one ("play something
# else" is media.next, "bring it down a notch" volume.set)
_TOOL_WORDS = {
    "media.next": re.compile(r"\b(next|skip|another|different|change|switch|else)\b"),
    "media.pause": re.compile(r"\b(pause|stop|hold|halt|freeze|mute|quiet|silence)\b"),
    "timer.cancel": re.compile(r"\b(timer|countdown|count down|cancel|stop)\b"),
    "lights.set": re.compile(r"\b(lights?|lamps?|dark\w*|bright\w*|illuminat\w*)\b"),
    "volume.set": re.compile(
        r"\b(volume|loud\w*|quiet\w*|hear|sound|blast|crank|soft\w*|level|notch|tone|"
        r"up|down|mute)\b"
    ),
}


# Words that name no tool: articles, pronouns, fillers, and the verbs any command may
# open with ("set", "turn", "make"), which tie "Set a timer" to ``thermostat.set`` no more
# than to anything else
_GENERIC_WORDS = (
    "a an the to of for in on at by with from and or my me your you i it this that is are "
    "be can could would will please um uh okay ok hey so now some set get turn make do "
    "start stop go put give let want need like"
)
_GENERIC = frozenset(_GENERIC_WORDS.split())


def _stems(text: str) -> set[str]:
    """``text``'s content words cut to a common root ("locked", "locks", "lock"; "brewing",
    "brew"): lower case, split at dots, dashes, underscores and camel case."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower()
    words = re.findall(r"[a-z]+", text)
    return {_stem(w) for w in words if w not in _GENERIC and len(w) > 1}


def _stem(word: str) -> str:
    for end in ("ing", "ed", "es", "s", "er"):
        if word.endswith(end) and len(word) - len(end) >= 3:
            return word[: -len(end)]
    return word


def untied(call: ToolCall, tool: Tool, text: str | None) -> bool:
    """``call`` is of a session's own tool (not a default one, which :func:`outside`
    reads with words fitted to it) and nothing in the request (``text``) names the tool:
    no content word of its name, description or parameters (names, descriptions, enum
    values) is one of the request's. The model then chose among the session's tools
    for a request none of them may do ("Play some jazz." in a session with
    ``shopping.add`` -> ``{item: "jazz"}``), or for one that says it in other words
    ("Turn the heat up to 23." -> ``thermostat.set``): the call is asked about, not
    made. The call's own argument values are not the tool's words (strings are copied
    from the request)."""
    if text is None or is_default(tool):
        return False
    return not _tool_stems(tool) & _stems(text)


# Parameters that name a place, and the people a user names by who they are to them:
# a place that is one of them is no address ("Navigate to my boss." has none to go to)
_WHERE = frozenset(["destination", "place", "location", "address"])
_KIN_WORDS = (
    "mom mum mommy mother dad daddy father parents sister brother sibling wife husband "
    "partner girlfriend boyfriend fiance fiancee son daughter kids children baby grandma "
    "grandmother granny grandpa grandfather aunt uncle cousin niece nephew boss manager "
    "colleague coworker friend friends neighbor neighbors neighbour neighbours roommate "
    "family"
)
_KIN = frozenset(_KIN_WORDS.split())


def unplaced(call: ToolCall, tool: Tool) -> bool:
    """A place of ``call`` is a person the user names by who they are to them ("my
    boss", "Mom"): where they are is not in the words, so the call is asked about
    ("Start directions to your boss?"), not made. "place a call to my boss" heard "place
    a portal to my boss" was ``navigation.start {destination: "my boss"}``. Places
    named by a person's trade ("the dentist") or home ("my mom's house") are places;
    none of the project's own commands is one (tests/model/test_ask.py)."""
    for p in tool.params:
        value = call.arguments.get(p.name)
        if p.name in _WHERE and isinstance(value, str):
            words = _WORDS.findall(value.lower())
            if words[:1] in (["my"], ["our"]):
                words = words[1:]
            if len(words) == 1 and words[0] in _KIN:
                return True
    return False


def named_tools(tools: Sequence[Tool], text: str) -> list[Tool]:
    """The ``tools`` whose own words (as :func:`untied` reads them) the request has: what
    the model chooses among, where no router names the tool ("Put eggs on the shopping
    list." among ``garage.open``, ``doors.lock`` and ``shopping.add``: ``shopping.add``
    alone, where the model's branches chose ``doors.lock``). Empty when none is named."""
    said = _stems(text)
    return [t for t in tools if _tool_stems(t) & said]


def _tool_stems(tool: Tool) -> set[str]:
    named = _stems(f"{tool.name} {tool.description}")
    for p in tool.params:
        named |= _stems(" ".join([p.name, p.description, *p.enum]))
    return named


def claims(opening: str) -> bool | None:
    """A reply that made no call opens by saying it does something a tool would
    ("Add milk to my shopping list." answered "I'll add milk to my shopping list."):
    said where tools were offered and none was called, it claims what nothing did.
    ``opening``: the reply's first words (:data:`CLAIM_WORDS` of them are enough);
    None while too few are in to tell (its first word may open a claim). None of the
    361 replies without a call in docs/results/evals opens so."""
    if _CLAIM.match(opening.strip()) is not None:
        return True
    words = _WORDS.findall(opening.lower())
    if len(words) > CLAIM_WORDS or (words and words[0] not in _CLAIM_FIRST):
        return False
    return None


CLAIM_WORDS = 8  # the longest opening _CLAIM reads: "Okay, I'm going to go ahead and add"
# the first words a claim may open with ("Okay, I'll ...", "Let me ..."): any other
# tells at once that the reply claims nothing, and it is spoken with no wait
_CLAIM_FIRST = frozenset(
    ["okay", "ok", "sure", "alright", "all", "got", "of", "no", "i'll", "i", "i'm", "i've", "let"]
)
_CLAIM = re.compile(
    r"^(?:(?:okay|ok|sure|alright|all right|got it|of course|no problem)[,.!]?\s+)?"
    r"(?:(?:i'll|i will|i'm going to|i am going to|i've|i have|let me|i'm|i am)\s+"
    r"(?:go ahead and\s+)?"
    r"(?:add|added|adding|put|read|reading|translate|translating|order|ordered|book|booked|"
    r"wake|set|setting|send|sent|sending|call|calling|play|playing|turn|turning|remind|"
    r"text|texting|message|schedule|scheduled|lock|locked|unlock|open|close|take|start|"
    r"started|cancel|cancelled|buy|note|save|saved|email|share|record|switch|create|"
    r"created|navigate)"
    # "I added milk to my shopping list." (the 4-bit file's reply): done, in the past
    r"|i\s+(?:just\s+|already\s+)?(?:added|put|translated|ordered|booked|set|sent|called|"
    r"played|turned|reminded|texted|messaged|scheduled|locked|unlocked|opened|closed|"
    r"started|cancell?ed|bought|noted|saved|emailed|shared|recorded|switched|"
    r"created|paused|stopped|skipped))\b",
    re.I,
)


def asked(call: ToolCall, tool: Tool) -> bool:
    """``call`` is asked about, not made: its tool is marked ``confirm``, the router
    was not sure the request asks for an action (:data:`SURE_TO_ACT`), a second
    hearing of the words heard others (``ToolCall.doubted``), or it lacks whom it is
    for (:func:`missing`)."""
    unsure = call.doubted or (call.margin is not None and call.margin < SURE_TO_ACT)
    return tool.confirm or unsure or missing(call, tool) is not None


def named(call: ToolCall, tool: Tool, text: str) -> ToolCall | None:
    """The incomplete ``call`` (:func:`missing`) with what the user's ``text``
    answered: to "Who should I call?" a name ("My sister." -> ``contact: "my
    sister"``; "To Tom, please." -> ``"Tom"``), to "For how long?" a number or duration
    (:func:`slot_value`: "Ten minutes." -> ``seconds: 600``). None when the words are no
    such answer: a yes or no, a question, a reference, a new request (more than four
    words, or a word no name has: "Set a timer."), a number out of the tool's range.
    Those drop the call, as any other words drop a question. A "-ty" out of range whose
    "-teen" fits (:func:`teen_twin`: "Sixty." heard for "Sixteen.") completes it with
    the twin, asked about."""
    wanted = next((p for p in tool.params if p.required and p.name not in call.arguments), None)
    if wanted is not None and _asks_number(wanted):
        short = len(_WORDS.findall(text.lower())) <= 6
        value = slot_value(wanted, text) if short else None
        if value is None:
            twin = teen_twin(wanted, text) if short else None
            if twin is None:
                return None
            return replace(call, arguments={**call.arguments, wanted.name: twin}, doubted=True)
        number = float(value)
        said = int(number) if number.is_integer() else number
        return replace(call, arguments={**call.arguments, wanted.name: said})
    if answer(text) is not None or "?" in text:
        return None
    m = _NAME_ANSWER.match(_SPACES.sub(" ", text).strip())
    name = m.group(1).strip() if m else ""
    words = _WORDS.findall(name.lower())
    if not words or len(words) > 4 or set(words) & _NOT_NAME or _REFERENCE.match(name):
        return None
    first, *rest = name.split(" ", 1)
    if first.lower() in _DETERMINERS:  # "My sister." is "my sister" inside a sentence
        name = " ".join([first.lower(), *rest])
    for p in tool.params:
        if p.name in _WHO and p.required and p.name not in call.arguments:
            return replace(call, arguments={**call.arguments, p.name: name})
    return None


_WORDS = re.compile(r"[a-z0-9']+")
_NAME_ANSWER = re.compile(
    r"^(?:(?:um|uh|oh|well|okay|ok|so)[,.]?\s+)*"
    r"(?:(?:call|phone|text|message|send it to|to|it's to|it's|it is|that's|that is)\s+)?"
    r"(.*?)(?:[,\s]+(?:please|thanks|thank you))?[.!]*$",
    re.I,
)
_DETERMINERS = frozenset(["my", "our", "the", "his", "their"])
# words in requests, questions and refusals, which no contact's name has
_NOT_NAME = frozenset(
    [
        "what",
        "when",
        "where",
        "why",
        "how",
        "who",
        "is",
        "are",
        "was",
        "set",
        "play",
        "turn",
        "stop",
        "cancel",
        "navigate",
        "timer",
        "volume",
        "lights",
        "music",
        "remind",
        "reminder",
        "never",
        "mind",
        "nobody",
        "no",
        "one",
        "nothing",
        "anyone",
        "someone",
        "don't",
        "not",
        "yes",
    ]
)


def _named(earlier: Sequence[ToolCall]) -> str | None:
    for call in reversed(earlier):
        for key in _WHO:
            value = call.arguments.get(key)
            if isinstance(value, str) and value.strip() and not _REFERENCE.match(value.strip()):
                return value
    return None
