"""Speech to text with faster-whisper (CTranslate2 Whisper), on already-segmented audio.

The endpointer decides where a turn starts and ends, so Whisper's own VAD filter is
off, and so are the features that cost latency without helping one short turn:
conditioning on previous text, timestamps, and the temperature fallback (a re-decode
at higher temperature doubles the time of the turns it triggers on; a short command
rarely needs it). Beam search is an option (``AsrOptions.beam_size``): fewer word
errors for a few decoder passes, but sentences ended early now and then.

A window sized to the turn (``AsrOptions.window``; the study is
docs/results/2026-12-asr-window.md). faster-whisper's ``transcribe`` hands the encoder
30 s of log-mel frames (3000) whatever the audio length, so a 3 s question pays for
ten times the frames it has. For tiny.en on a CPU the transcriber instead computes the
features of the audio alone, appends ``pad_frames`` frames of silence and calls
CTranslate2's Whisper directly, which accepts a window shorter than 3000 frames: about
4x faster on 1-6 s turns, with no more word errors on the project's test speech.
Whisper was trained on 30 s windows only, and a short window makes the greedy decoder
loop (it writes the sentence again and again: one turn in eight with 3 s of padding,
more with less); a loop that ends the text is cut where it starts
(:func:`cut_repetition`), and the decode is bounded by a token budget proportional to
the audio. Turns longer than the 30 s window, language detection, a decode that spends
its whole budget without a loop to cut, and a text that still repeats itself after the
cut (:func:`looks_looped`: a loop that is not exactly periodic, "Stop. What time is it?
Stop. What time is it? Stop. Stop. What time is it?") go to the full-window path.

A transcript is ``trusted`` unless the full window's text repeats itself too; its text
is then de-duplicated (:func:`dedupe_sentences`: each sentence kept once, in order), so
that the reply answers what was said once, and the session takes no action on it.

``transcribe`` blocks for tens to hundreds of milliseconds: the server runs it in a
worker thread. One :class:`Transcriber` is shared by all sessions; CTranslate2 models
accept concurrent calls (they are queued on ``num_workers`` model replicas, 1 by
default).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import ctranslate2
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import get_suppressed_tokens
from numpy.typing import NDArray

from audio.assets import whisper_model

SAMPLE_RATE = 16_000
FRAMES_PER_S = 100  # log-mel frames a second (a hop of 160 samples)
Window = Literal["auto", "sized", "full"]

# faster-whisper's defaults for skipping a window as silence: both must hold.
NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
# faster-whisper's default for "too repetitive": the text's UTF-8 bytes over their zlib
# size. The 6,887 user lines in data/ are at most 1.3; a loop passes 2.4 once long enough.
COMPRESSION_RATIO_THRESHOLD = 2.4
# Greedy by default: a beam of 5 makes a fifth fewer word errors on the spoken eval's
# turns, but ends some sentences early (a fresh install's Piper audio of "Your package
# will arrive on Friday afternoon." came back "Your package will arrive"); the sized
# window guards it with the greedy decode beside it (ended_early), which costs that
# decode too, and through the server it acts on more lines nobody meant as commands
# (docs/audio.md, "Beam search")
BEAM_SIZE = 1
MAX_PROMPT_TOKENS = 223  # Whisper's previous text: at most half its 448-token context


@dataclass(frozen=True)
class Transcript:
    text: str  # stripped; "" when nothing was recognised
    language: str
    audio_s: float  # duration of the audio transcribed
    no_speech_prob: float  # Whisper's "this was not speech" (highest over segments)
    avg_logprob: float  # mean token log-probability (lowest over segments)
    # False: every window's decode repeated itself (looks_looped); the text is
    # de-duplicated, fit to answer but not to act on
    trusted: bool = True


@dataclass(frozen=True)
class AsrOptions:
    device: str = "cpu"
    compute_type: str = "int8"
    cpu_threads: int = 2
    language: str | None = "en"  # None: detect (multilingual models only; costs a pass)
    # "sized": the encoder sees the turn's frames + pad_frames; "full": 30 s, as
    # faster-whisper does; "auto": sized for tiny.en on CPU, full for base and on a
    # GPU (resolve_window).
    window: Window = "auto"
    pad_frames: int = 300  # 10 ms each: 3 s of silence after the turn (docs/audio.md)
    # A sized window's frames are rounded up to a multiple of this (1 s): turns whose
    # windows come out alike are heard in one Whisper call, each exactly as alone
    # (transcribe_batch); the encoder takes no mask, so a turn padded to another's
    # length would be heard with more silence, and other words (docs/latency.md)
    grid_frames: int = 100
    # Decode budget of the sized window, in tokens: base + per second of audio. Speech
    # runs at 3-5 tokens/s; a loop needs two copies of its sentence to be recognised.
    budget_tokens: int = 12
    budget_tokens_per_s: float = 10.0
    # Words Whisper reads as what was said before the turn (its previous-text prompt,
    # faster-whisper's initial_prompt): the assistant's vocabulary makes command words
    # likelier (None: no prompt)
    prompt: str | None = None
    # Hypotheses Whisper's decoder keeps (1: greedy). A beam costs decoder passes, not
    # encoder ones (see BEAM_SIZE)
    beam_size: int = BEAM_SIZE


@dataclass(frozen=True)
class SizedDecode:
    text: str  # as decoded, loops included
    capped: bool  # the token budget ran out before the end token
    no_speech_prob: float
    avg_logprob: float


class Transcriber:
    def __init__(self, model_dir: str, options: AsrOptions | None = None):
        self.options = options if options is not None else AsrOptions()
        o = self.options
        self.model_dir = model_dir
        self.model = WhisperModel(
            model_dir, device=o.device, compute_type=o.compute_type, cpu_threads=o.cpu_threads
        )
        self.multilingual = bool(self.model.model.is_multilingual)
        self.language = o.language if (o.language or not self.multilingual) else None
        if not self.multilingual:
            self.language = "en"
        self.window = resolve_window(o.window, o.device, self.multilingual)
        self._tokenizer = Tokenizer(
            self.model.hf_tokenizer,
            self.multilingual,
            task="transcribe",
            language=self.language or "en",
        )
        # faster-whisper's prompt and suppressed tokens for the same settings
        before = []
        if o.prompt:  # as faster-whisper lays out initial_prompt (get_prompt)
            text = self._tokenizer.encode(" " + o.prompt.strip())
            before = [self._tokenizer.sot_prev, *text[-MAX_PROMPT_TOKENS:]]
        self._prompt = [*before, *self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]
        self._suppress = list(get_suppressed_tokens(self._tokenizer, [-1]) or [])

    def transcribe(self, audio: NDArray[np.floating]) -> Transcript:
        """Transcribe 16 kHz mono float32 audio (one turn). Blocking."""
        x = np.ascontiguousarray(audio, dtype=np.float32)
        if len(x) == 0:
            return Transcript("", self.language or "en", 0.0, 1.0, 0.0)
        if self.window == "sized" and self.language is not None:
            sized = self.transcribe_sized(x)
            if sized is not None:
                return sized
        return self._heard_in_full(x)

    def _heard_in_full(self, x: NDArray[np.float32]) -> Transcript:
        """The 30 s window's transcript, de-duplicated and untrusted where it loops."""
        full = self.transcribe_full(x)
        if not looks_looped(full.text):
            return full
        return replace(full, text=dedupe_sentences(full.text), trusted=False)

    def transcribe_batch(self, audios: Sequence[NDArray[np.floating]]) -> list[Transcript]:
        """Several turns at once (concurrent sessions' transcripts), each exactly as
        :meth:`transcribe` hears it alone: the turns whose sized windows have one length
        (AsrOptions.grid_frames) in one greedy decode, the rest one call each. A turn
        that needs the full window (past 30 s, a loop, a spent budget) is heard alone
        as :meth:`transcribe` would; so is every turn with a beam, or in the 30 s
        window. Blocking."""
        xs = [np.ascontiguousarray(a, dtype=np.float32) for a in audios]
        sized = self.window == "sized" and self.language is not None and self.options.beam_size == 1
        windows = [self.sized_features(x) if sized and len(x) else None for x in xs]
        alike: dict[int, list[int]] = {}  # window length -> the turns with it
        for i, w in enumerate(windows):
            if w is not None:
                alike.setdefault(w.shape[-1], []).append(i)
        out: list[Transcript | None] = [None] * len(xs)
        for group in alike.values():
            stacked = np.concatenate([windows[i] for i in group])
            budgets = [self._budget(stacked[:1])] * len(group)
            decodes = self._generate_many(ctranslate2.StorageView.from_array(stacked), budgets)
            for i, d in zip(group, decodes, strict=True):
                heard = self._checked(xs[i], d)
                # a window whose decode fails its checks goes to the 30 s window, not
                # through the sized one again
                out[i] = heard if heard is not None else self._heard_in_full(xs[i])
        return [t if t is not None else self.transcribe(x) for t, x in zip(out, xs, strict=True)]

    def transcribe_full(self, x: NDArray[np.float32]) -> Transcript:
        """faster-whisper's own path: 30 s windows, one after another past 30 s."""
        segments, info = self.model.transcribe(
            x,
            language=self.language,
            beam_size=self.options.beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
            initial_prompt=self.options.prompt,
        )
        segs = list(segments)  # the generator does the decoding
        return Transcript(
            text=" ".join(s.text.strip() for s in segs).strip(),
            language=info.language,
            audio_s=len(x) / SAMPLE_RATE,
            no_speech_prob=max((s.no_speech_prob for s in segs), default=1.0),
            avg_logprob=min((s.avg_logprob for s in segs), default=0.0),
        )

    def transcribe_sized(self, x: NDArray[np.float32]) -> Transcript | None:
        """One window of the turn's frames + silence; None where the full path must run."""
        d = self.decode_sized(x)
        return None if d is None else self._checked(x, d)

    def _checked(self, x: NDArray[np.float32], d: SizedDecode) -> Transcript | None:
        """A sized window's decode as a transcript, or None where the full path must run."""
        text = cut_repetition(d.text)
        if d.capped and text == d.text:
            return None  # spent the budget on something that is not a loop: decode fully
        if looks_looped(text):
            return None  # a loop cut_repetition cannot see: Whisper's own 30 s window
        if d.no_speech_prob > NO_SPEECH_THRESHOLD and d.avg_logprob < LOG_PROB_THRESHOLD:
            text = ""  # faster-whisper skips such a window as silence
        language = self.language or "en"
        return Transcript(text, language, len(x) / SAMPLE_RATE, d.no_speech_prob, d.avg_logprob)

    def decode_sized(self, x: NDArray[np.float32]) -> SizedDecode | None:
        """The sized window's decode, before its checks; None past 30 s of audio. With a
        beam, the greedy decode runs beside it on the same encoder output, and is taken
        where the beam's words (loops cut) are a word-prefix of greedy's: beam search
        can end a sentence early ("Your package will arrive" for "... arrive on Friday
        afternoon.", its shorter hypothesis scoring higher per token)."""
        window = self.sized_features(x)
        if window is None:
            return None
        o = self.options
        budget = self._budget(window)
        features = ctranslate2.StorageView.from_array(window)
        if o.beam_size == 1:
            return self._generate(features, 1, budget)
        encoded = self.model.model.encode(features, to_cpu=False)
        beam = self._generate(encoded, o.beam_size, budget)
        greedy = self._generate(encoded, 1, budget)
        return greedy if ended_early(beam.text, greedy.text) else beam

    def _budget(self, window: NDArray[np.float32]) -> int:
        """Tokens a sized decode of ``window`` may write (AsrOptions.budget_tokens...),
        from its frames: windows of one length decode to one budget, alone or together."""
        o = self.options
        seconds = max(window.shape[-1] - o.pad_frames, 0) / FRAMES_PER_S
        return min(int(o.budget_tokens + o.budget_tokens_per_s * seconds), 224)

    def _generate(self, features: ctranslate2.StorageView, beam: int, budget: int) -> SizedDecode:
        """One decode of the window's log-mel or encoder output (CTranslate2 takes
        either) with ``beam`` hypotheses and a budget of ``budget`` tokens."""
        return self._generate_many(features, [budget], beam)[0]

    def _generate_many(
        self, features: ctranslate2.StorageView, budgets: Sequence[int], beam: int = 1
    ) -> list[SizedDecode]:
        """A decode of each window of ``features`` (a batch), each held to its own
        budget: the batch runs to the largest, and a window's tokens past its own are
        dropped, so it reads as its decode alone would (``capped``)."""
        top = max(budgets)
        results = self.model.model.generate(
            features,
            [self._prompt] * len(budgets),
            beam_size=beam,
            # CTranslate2 stops Whisper after max_length // 2 new tokens (Whisper's
            # sample_len: half the text context), and at max_length with the prompt
            max_length=max(2 * top, len(self._prompt) + top),
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppress,
        )
        decodes = []
        for result, budget in zip(results, budgets, strict=True):
            ids = result.sequences_ids[0]
            capped = len(ids) >= budget
            tokens = [t for t in ids[:budget] if t < self._tokenizer.eot]
            decodes.append(
                SizedDecode(
                    text=self._tokenizer.decode(tokens).strip(),
                    capped=capped,
                    no_speech_prob=result.no_speech_prob,
                    # faster-whisper's average: the log-probs of the tokens and the end
                    # token (past its own budget, a loop the checks then read, the whole
                    # decode's score)
                    avg_logprob=result.scores[0] * len(tokens) / (len(tokens) + 1),
                )
            )
        return decodes

    def sized_features(self, x: NDArray[np.float32]) -> NDArray[np.float32] | None:
        """(1, n_mels, frames): the log-mel of x, then at least pad_frames of zeros, up
        to a multiple of grid_frames (even: the encoder's stride-2 convolution halves
        it). Zeros are faster-whisper's padding of the 30 s window too (pad_or_trim).
        None when the audio fills the 30 s window already.
        """
        fe = self.model.feature_extractor
        features = fe(x)
        # the extractor pads 160 samples: its last frame is that padding, dropped as
        # faster-whisper does
        content = features.shape[-1] - 1
        if content > fe.nb_max_frames:
            return None
        grid = max(1, self.options.grid_frames)
        frames = min(fe.nb_max_frames, -(-(content + self.options.pad_frames) // grid) * grid)
        frames += frames % 2
        window = np.zeros((1, features.shape[0], frames), np.float32)
        window[0, :, :content] = features[:, :content]
        return window


def resolve_window(window: Window, device: str, multilingual: bool) -> Literal["sized", "full"]:
    """The window "auto" means: "sized" for an English-only model on CPU, where it was
    measured to keep the word error rate (tiny.en); "full" for the multilingual base,
    which loses 1.5-2.2 points on clean speech with sized windows, and on a GPU, where
    the 30 s window costs tens of ms and sized windows have not been measured."""
    if window == "auto":
        return "sized" if device == "cpu" and not multilingual else "full"
    return window


_WORD_KEY = re.compile(r"[^\w']+")


def _words(text: str) -> list[str]:
    """The words of ``text``, lowercased, without punctuation."""
    return [k for w in text.split() if (k := _WORD_KEY.sub("", w.lower()))]


def ended_early(beam: str, greedy: str) -> bool:
    """The beam's text (its loop cut) is the greedy text's first words and no more:
    "Your package will arrive" against "Your package will arrive on Friday afternoon."."""
    said, heard = _words(cut_repetition(beam)), _words(cut_repetition(greedy))
    return len(said) < len(heard) and heard[: len(said)] == said


def cut_repetition(text: str, min_words: int = 3, min_copies_short: int = 4) -> str:
    """Cut a decoding loop: text that ends repeating the same words, kept once.

    "How far is it? How far is it? How far" -> "How far is it?". The repeating part
    must run to the end of the text (a loop only ends at the token budget or with the
    end token) with two whole copies of a sentence ("Yes, please. Yes, please."), or
    of at least ``min_words`` words, or ``min_copies_short`` copies of a shorter unit
    ("the the the the"), so that "New York, New York" and "Bye bye" are left alone.
    Words compare lowercased, without punctuation. Said twice, a command means what
    it means once: a cut that is wrong costs little.
    """
    words = text.split()
    keys = [_WORD_KEY.sub("", w.lower()) for w in words]
    n_words = len(words)
    best = n_words
    for period in range(1, n_words // 2 + 1):
        start = n_words - period  # earliest i with keys[i:] periodic with this period
        while start > 0 and keys[start - 1] == keys[start - 1 + period]:
            start -= 1
        copies = (n_words - start) // period
        sentence = words[start + period - 1].endswith((".", "?", "!"))
        long_enough = sentence or period >= min_words or copies >= min_copies_short
        if copies >= 2 and long_enough:
            best = min(best, start + period)
    return text if best == n_words else " ".join(words[:best])


def compression_ratio(text: str) -> float:
    """The text's UTF-8 size over its zlib size: faster-whisper's measure of a decode
    that repeats itself (each copy of a loop compresses to a back-reference)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _sentences(text: str) -> list[str]:
    """The text split after each ".", "?" or "!" that ends a word."""
    return [s for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s]


def _keys(text: str) -> list[str]:
    """Words lowercased without punctuation, as cut_repetition compares them."""
    return [k for k in (_WORD_KEY.sub("", w.lower()) for w in text.split()) if k]


def looks_looped(text: str, min_copies: int = 3, min_run: int = 4) -> bool:
    """Whether a transcript repeats itself as a decoding loop does, anywhere in it.

    Three tests, any one enough: faster-whisper's compression ratio over
    :data:`COMPRESSION_RATIO_THRESHOLD` (its signal of a loop, but zlib's overhead keeps
    a short text under it: the four-sentence loop "Stop. What time is it? Stop. What
    time is it? Stop. Stop. What time is it? Stop." is 2.2); one sentence ``min_copies``
    times; or one run of ``min_run`` words ``min_copies`` times without overlap (a loop
    written with commas). People say a phrase twice ("New York, New York", "Bye bye",
    "Yes, please. Yes, please.") but rarely the same sentence three times in one turn.
    """
    if compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD:
        return True
    sentences = [" ".join(_keys(s)) for s in _sentences(text)]
    if any(sentences.count(s) >= min_copies for s in set(sentences) if s):
        return True
    keys = _keys(text)
    for start in range(len(keys) - min_run * min_copies + 1):
        run, copies, i = keys[start : start + min_run], 1, start + min_run
        while i + min_run <= len(keys):
            if keys[i : i + min_run] == run:
                copies, i = copies + 1, i + min_run
            else:
                i += 1
        if copies >= min_copies:
            return True
    return False


def dedupe_sentences(text: str) -> str:
    """Each sentence once, in the order first said: a sentence whose words were all
    said already, one after another, is dropped ("Stop. What time is it? Stop. Stop,
    what time is it?" -> "Stop. What time is it?"); then a loop that ends the text is
    cut (cut_repetition). A loop repeats what was heard, so its first copy is the best
    guess at what was said."""
    kept: list[str] = []
    said: list[str] = []
    for sentence in _sentences(text):
        keys = _keys(sentence)
        n = len(keys)
        if not keys or any(said[i : i + n] == keys for i in range(len(said) - n + 1)):
            continue
        kept.append(sentence)
        said += keys
    return cut_repetition(" ".join(kept))


def load_transcriber(
    name: str = "base", cache_dir: Path | None = None, options: AsrOptions | None = None
) -> Transcriber:
    """Load "tiny.en", "base" (offline packages), a model directory, or a hub name."""
    return Transcriber(whisper_model(name, cache_dir), options)


def recommended_model(device: str) -> str:
    """The default Whisper model for a device (measurements in docs/audio.md).

    On a GPU, "base": fewer word errors, and its extra cost is a few tens of ms. On CPU,
    "tiny.en": on the spoken eval's lines (three voices, clean and in 10 dB noise) base
    made as many word errors overall, sized (+48 ms a turn on 2 cores) or in the 30 s
    window (+1.2 s); served with the 30 s window it made 4 fewer wrong calls and 11
    more false actions than tiny.en (docs/audio.md, "Which model").
    """
    return "tiny.en" if device == "cpu" else "base"
