"""Numbers and durations as people say them: "twenty five point five", "an hour and a
half", "1 hour and five minutes".

A call's number is the user's number, as its strings are the user's words
(``model/actions.py``). The reply model copies what it sees ("35 minutes" -> ``35``),
but a 135M adapter trained for 100 steps neither reads "twenty five point five" as
25.5 nor multiplies minutes by 60 ("Set a timer for 35 minutes" -> ``seconds: 35``,
18 of 20 held-out timers). Reading a spoken number or duration is not a language
model's job but inverse text normalisation, as every voice assistant's slot parser
does; here it is a few rules over English number words, and the decoder lays the value
down when the user said exactly one (:func:`slot_value`), else the model writes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from model.tools import Param

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
)
ONES = {w: i for i, w in enumerate(_ONES.split(" "))}
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety"
TENS = {w: 10 * i for i, w in enumerate(_TENS.split(" "), 2)}
SCALES = {"hundred": 100, "thousand": 1000}
# seconds per unit, by every spelling a transcript gives
UNITS = {
    **dict.fromkeys(("second", "seconds", "sec", "secs"), 1),
    **dict.fromkeys(("minute", "minutes", "min", "mins"), 60),
    **dict.fromkeys(("hour", "hours", "hr", "hrs"), 3600),
}
# a parameter named for a unit takes a duration in that unit
UNIT_PARAMS = {"seconds": 1, "minutes": 60, "hours": 3600}

_WORD = re.compile(r"\d+(?:\.\d+)?|[a-z]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("-", " "))


def is_number_word(w: str) -> bool:
    """A lowercased word that says (part of) a number: "seven", "twenty", "hundred", "7"."""
    return w in ONES or w in TENS or w in SCALES or _digits(w)


def _digits(w: str) -> bool:
    return w[:1].isdigit()


def _read_number(words: list[str], i: int) -> tuple[float, int] | None:
    """The number spoken from ``words[i]`` on, and the index after it; None when no
    number starts there. "twenty five point five", "one hundred and five", "7",
    "seven and a half"."""
    if i >= len(words) or not is_number_word(words[i]) or words[i] in SCALES:
        return None
    if _digits(words[i]):
        value, j = float(words[i]), i + 1
    else:
        total = current = 0
        j = i
        while j < len(words):
            w = words[j]
            if w in ONES or w in TENS:
                current += ONES.get(w, 0) + TENS.get(w, 0)
            elif w in SCALES:
                current = max(current, 1) * SCALES[w]
                if SCALES[w] == 1000:
                    total, current = total + current, 0
            elif (
                w == "and"
                and j > i
                and words[j - 1] in SCALES
                and j + 1 < len(words)
                and (words[j + 1] in ONES or words[j + 1] in TENS)
            ):
                pass  # "one hundred and five"
            else:
                break
            j += 1
        value = float(total + current)
        if j < len(words) - 1 and words[j] == "point":  # "twenty five point five"
            decimals = ""
            k = j + 1
            while k < len(words) and words[k] in ONES and ONES[words[k]] < 10:
                decimals += str(ONES[words[k]])
                k += 1
            if decimals:
                value, j = float(f"{int(value)}.{decimals}"), k
    if words[j : j + 3] == ["and", "a", "half"]:  # "seven and a half"
        value, j = value + 0.5, j + 3
    return value, j


def _numbers(words: list[str]) -> dict[int, float]:
    """Every number said in ``words``, by the index of the word after it, in order."""
    found: dict[int, float] = {}
    i = 0
    while i < len(words):
        if (read := _read_number(words, i)) is None:
            i += 1
            continue
        value, i = read
        found[i] = value
    return found


def spoken_numbers(text: str) -> list[float]:
    """Every number said in ``text``, in order."""
    return list(_numbers(_words(text)).values())


def _quantities(words: list[str]) -> Iterator[tuple[float, int]]:
    """(quantity, unit index) for every unit word: the number before it ("two
    minutes"), "a" / "an" ("an hour"), "half a" / "half an" ("half an hour"), "a
    quarter of" / "three quarters of" ("a quarter of an hour"), plus
    "and a half" after it ("a minute and a half")."""
    starts = _numbers(words)  # index after a number -> the number
    for u, w in enumerate(words):
        if w not in UNITS:
            continue
        if u in starts:
            q = starts[u]
        elif u >= 3 and words[u - 3 : u - 1] in (["quarter", "of"], ["quarters", "of"]):
            q = 0.75 if u >= 4 and words[u - 4] == "three" else 0.25  # "a quarter of an hour"
        elif u >= 1 and words[u - 1] in ("a", "an"):
            q = 0.5 if u >= 2 and words[u - 2] == "half" else 1.0
        else:
            continue
        if words[u + 1 : u + 4] == ["and", "a", "half"]:
            q += 0.5
        yield q, u


def spoken_duration(text: str) -> float | None:
    """The duration said in ``text``, in seconds ("1 hour and five minutes" -> 3900,
    "half an hour" -> 1800); None when no quantity with a unit is said."""
    words = _words(text)
    found = [q * UNITS[words[u]] for q, u in _quantities(words)]
    return sum(found) if found else None


def bare_numbers(text: str) -> list[float]:
    """The numbers said in ``text`` that count no unit of time ("nineteen degrees",
    "volume five"; not the "ten" of "ten minutes"), in order."""
    words = _words(text)
    timed = {u for _, u in _quantities(words)}
    return [v for after, v in _numbers(words).items() if after not in timed]


def slot_value(p: Param, user: str) -> str | None:
    """The value text of the number ``p`` when the user said it once, else None (the
    model writes it): for a parameter named for a unit (``seconds``, ``minutes``,
    ``hours``) the duration said, converted; for any other number, the one number
    said, when exactly one is and it fits the schema (an integer for an integer, inside
    ``minimum`` / ``maximum``)."""
    if p.type not in ("integer", "number"):
        return None
    if p.name in UNIT_PARAMS and (seconds := spoken_duration(user)) is not None:
        value = seconds / UNIT_PARAMS[p.name]
    else:
        said = set(spoken_numbers(user))
        if len(said) != 1:
            return None
        (value,) = said
    if p.type == "integer" and not value.is_integer():
        return None
    if not p.within(value):
        return None
    return str(int(value)) if value.is_integer() else str(value)


# ---------------------------------------------------------------- numbers as said

_SCALE_WORDS = ((1000, "thousand"), (100, "hundred"))


def say_integer(n: int) -> str:
    """``n`` in words as :func:`spoken_numbers` reads them back ("nineteen",
    "one thousand eight hundred"); digits from a million on, which no rule here reads."""
    if n < 0:
        return f"minus {say_integer(-n)}"
    if n >= 1_000_000:
        return str(n)
    for scale, word in _SCALE_WORDS:
        if n >= scale:
            head, rest = divmod(n, scale)
            said = f"{say_integer(head)} {word}"
            return f"{said} {say_integer(rest)}" if rest else said
    if n < 20:
        return _ONES.split(" ")[n]
    tens, ones = divmod(n, 10)
    said = _TENS.split(" ")[tens - 2]
    return f"{said} {_ONES.split(' ')[ones]}" if ones else said


def say_number(x: float) -> str:
    """A number in words: "nineteen", "twenty one point five"."""
    if float(x).is_integer():
        return say_integer(int(x))
    whole, _, decimals = f"{x:.6g}".partition(".")
    return f"{say_integer(int(whole))} point {' '.join(_ONES.split(' ')[int(d)] for d in decimals)}"


def say_quantity(x: float, unit: str) -> str:
    """ "nineteen degrees", "one minute": the unit's plural after any number but one."""
    return f"{say_number(x)} {unit if x == 1 else unit + 's'}"


def say_duration(seconds: float) -> str:
    """A duration in its largest whole units: 1800 -> "thirty minutes", 5400 -> "one
    hour and thirty minutes", 45 -> "forty five seconds"."""
    parts, rest = [], float(seconds)
    for unit, size in (("hour", 3600), ("minute", 60)):
        if rest >= size:
            whole, rest = divmod(rest, size)
            parts.append(say_quantity(whole, unit))
    if rest or not parts:
        parts.append(say_quantity(rest, "second"))
    return " and ".join(parts)
