"""The demo page's microphone path is as good as the direct one (issue 21 item 8).

The same WAVs go to the same server twice: through the page in headless Chromium with
Chromium's file microphone (getUserMedia with the page's constraints, the audio
context, clients/web/capture-worklet.js: what a user's microphone goes through), and
through the smart-glasses client, which sends the WAV's PCM as it is. The page must
hear what the glasses hear. docs/results/2026-12-page-capture.md has the measurement
behind the bounds: with the browser's noise suppression and gain control on, an
espeak-ng "Navigate to the nearest gas station." came back "... another risk station."
on the page and "... the nearest gas station." directly.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from audio.resample import resample
from audio.speech import (
    QUESTIONS,
    SpeechFactory,
    have_espeak,
    normalize_words,
    word_error_rate,
    write_wav,
)
from clients.common import read_wav
from clients.devices import WavMicrophone, WavSpeaker
from clients.glasses import Glasses, GlassesOptions
from tests.serverproc import ServerProcess
from tests.speech import missing

from .conftest import browser_page
from .test_web_page import browser_args

pytestmark = [pytest.mark.e2e, pytest.mark.models]

LEAD_S = 2.5  # the page drops audio until its session is ready; the file plays from the start
TRAIL_S = 3.0


@dataclass(frozen=True)
class Utterance:
    voice: str  # "piper" or "espeak"
    text: str
    rate: int  # of the WAV: Chromium's file microphone and the glasses client both take it

    def wav(self, speech: SpeechFactory, folder: Path) -> tuple[Path, NDArray[np.float32]]:
        """The WAV, and its audio at 16 kHz (what both paths should deliver)."""
        make = speech.piper if self.voice == "piper" else speech.espeak
        audio = make(self.text, lead_s=LEAD_S, trail_s=TRAIL_S)
        name = "-".join([self.voice, str(self.rate), *normalize_words(self.text)]) + ".wav"
        return write_wav(folder / name, resample(audio, 16000, self.rate), self.rate), audio


# Utterances whose transcript stayed the same on the direct path, with its start moved
# by 5-20 ms, and on the page, over repeated runs. The reported sentence is not one of
# them: tiny.en hears espeak-ng's "Navigate to the nearest gas station." as "Now we get
# to the nearest gas station." or, with the same WAV started 5 ms later, "Now we get to
# another risk station." even directly; the page's noise suppression and gain control
# made the second its answer every time. It goes through the page only, for the check
# of what the page changes in it.
COMPARED = (
    Utterance("piper", QUESTIONS[5], 48000),  # the pharmacy on Main Street
    Utterance("piper", QUESTIONS[3], 16000),  # remind me ... at seven thirty
    Utterance("espeak", QUESTIONS[10], 48000),  # the capital of Australia
    Utterance("piper", "Navigate to the nearest gas station.", 16000),
)
REPORTED = Utterance("espeak", "Navigate to the nearest gas station.", 48000)
# A word of a sentence of ten or fewer is 0.1 or more: the page gets no word wrong that
# the direct path gets right.
PER_UTTERANCE_MARGIN = 0.1
MEAN_MARGIN = 0.05
# Whisper's log-mel features of what the page sent against those of the WAV (median
# over the utterances, dB): about 0.4 with the page's settings, 5.5 with noise
# suppression and gain control on, 2.8 with gain control alone; 0.8 with the old
# resampler, which the tone test below catches.
MAX_MEL_CHANGE_DB = 1.0


# Records, without changing them, the page's WebSocket traffic: the server's events and
# the audio frames the page sends.
WIRE = """(() => {
  const Native = window.WebSocket;
  const wire = (window.qsWire = { events: [], frames: [] });
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (e) => {
        if (typeof e.data === "string") wire.events.push(JSON.parse(e.data));
      });
    }
    send(data) {
      if (typeof data !== "string") wire.frames.push(new Int16Array(data.slice(0)));
      super.send(data);
    }
  };
  window.qsSentAudio = () => {
    const all = new Int16Array(wire.frames.reduce((n, f) => n + f.length, 0));
    wire.frames.reduce((at, f) => (all.set(f, at), at + f.length), 0);
    const bytes = new Uint8Array(all.buffer);
    let text = "";
    for (let i = 0; i < bytes.length; i += 8192) {
      text += String.fromCharCode(...bytes.subarray(i, i + 8192));
    }
    return btoa(text);
  };
})();"""

# Done: the page has sent the whole utterance and more, and every turn it started has
# its final transcript.
HEARD = """([seconds]) => {
  const { events, frames } = window.qsWire;
  const started = events.filter((e) => e.type === "speech_started").map((e) => e.turn_id);
  const finals = events.filter((e) => e.type === "transcript_final").map((e) => e.turn_id);
  const heard = started.length > 0 && started.every((t) => finals.includes(t));
  return heard && frames.length * 0.02 >= seconds;
}"""


@dataclass
class PageTurn:
    transcript: str
    sent: NDArray[np.float32]  # the 16 kHz audio the page sent
    settings: dict[str, Any]  # the microphone track's getSettings()


async def through_the_page(chromium: Path, http: str, wav: Path, seconds: float) -> PageTurn:
    """The WAV as the page's microphone; ``seconds``: how much of it the page must send."""
    async with browser_page(chromium, browser_args(wav)) as (page, errors):
        await page.add_init_script(WIRE)
        await page.goto(f"{http}/")
        await page.click("#toggle")
        await page.wait_for_function(HEARD, arg=[seconds], timeout=120_000, polling=100)
        events = await page.evaluate("qsWire.events")
        settings = await page.evaluate("qsSession.stream.getAudioTracks()[0].getSettings()")
        sent = base64.b64decode(await page.evaluate("qsSentAudio()"))
    assert not errors, errors
    finals = {e["turn_id"]: e["text"] for e in events if e["type"] == "transcript_final"}
    pcm = np.frombuffer(sent, "<i2").astype(np.float32) / np.float32(32768)
    assert pcm.size and np.abs(pcm[:1600]).max() < 0.01, "the page was not ready before the speech"
    return PageTurn(" ".join(finals[t] for t in sorted(finals)), pcm, settings)


async def through_the_glasses(url: str, wav: Path) -> str:
    def quiet(_message: object, _frame: str | bytes) -> None:
        pass

    mic = WavMicrophone(read_wav(wav))
    glasses = Glasses(GlassesOptions(url, timeout_s=120), mic, WavSpeaker(16000), quiet)
    [result] = await glasses.run()
    return result.transcript


def mel_change_db(reference: NDArray[np.float32], sent: NDArray[np.float32]) -> float:
    """How much the page changed what Whisper hears: the mean |difference|, in dB, of
    Whisper's log-mel features of the reference's speech and of the page's audio aligned
    to it, over the frames within 40 dB of the loudest, less the median difference (one
    gain for the whole utterance is no change to Whisper)."""
    from faster_whisper.feature_extractor import FeatureExtractor

    loud = np.flatnonzero(np.abs(reference) > 0.003)
    speech = reference[loud[0] : loud[-1] + 1]
    assert len(sent) > len(speech), "the page sent less audio than the utterance"
    n = 1 << int(np.ceil(np.log2(len(sent) + len(speech))))
    corr = np.fft.irfft(np.fft.rfft(sent, n) * np.conj(np.fft.rfft(speech, n)), n)
    lag = int(np.argmax(corr[: len(sent) - len(speech) + 1]))
    features = FeatureExtractor(feature_size=80)  # log10 mel power / 4, floor 80 dB down
    a = features(speech, padding=0)
    b = features(sent[lag : lag + len(speech)], padding=0)
    frames = a.max(axis=0) > a.max() - 1.0
    diff = 40 * (a - b)[:, frames]
    return float(np.mean(np.abs(diff - np.median(diff))))


@dataclass
class Heard:
    utterance: Utterance
    page: PageTurn
    direct: str  # the glasses' transcript
    mel_change_db: float

    @property
    def page_wer(self) -> float:
        return word_error_rate(self.utterance.text, self.page.transcript)

    @property
    def direct_wer(self) -> float:
        return word_error_rate(self.utterance.text, self.direct)

    def __str__(self) -> str:
        u = self.utterance
        return (
            f"{u.voice} {u.rate} Hz {u.text!r}: page {self.page_wer:.2f} "
            f"{self.page.transcript!r}, direct {self.direct_wer:.2f} {self.direct!r}, "
            f"log-mel change {self.mel_change_db:.2f} dB"
        )


async def test_the_page_hears_what_the_glasses_hear(
    server: ServerProcess, speech: SpeechFactory, chromium: Path, tmp_path: Path
) -> None:
    if not have_espeak():
        missing("espeak-ng is not installed (apt-get install espeak-ng)")
    heard, mel_changes = [], []
    for utterance in (*COMPARED, REPORTED):
        wav, audio = utterance.wav(speech, tmp_path)
        page = await through_the_page(chromium, server.http, wav, len(audio) / 16000 - LEAD_S)
        mel_changes.append(mel_change_db(audio, page.sent))
        if utterance in COMPARED:
            direct = await through_the_glasses(server.url, wav)
            heard.append(Heard(utterance, page, direct, mel_changes[-1]))
    changes = ", ".join(f"{m:.2f}" for m in mel_changes)
    report = "\n".join([*map(str, heard), f"log-mel change of each, dB: {changes}"])
    for h in heard:
        assert h.page_wer <= h.direct_wer + PER_UTTERANCE_MARGIN, report
    page_wer = np.mean([h.page_wer for h in heard])
    assert page_wer <= np.mean([h.direct_wer for h in heard]) + MEAN_MARGIN, report
    assert np.median(mel_changes) <= MAX_MEL_CHANGE_DB, report
    settings = page.settings
    assert settings["echoCancellation"] is True, settings  # barge-in over speakers
    assert settings["noiseSuppression"] is False, settings
    assert settings["autoGainControl"] is False, settings


# The capture worklet alone, offline (faster than real time, no microphone): a tone
# through it at the usual audio-context rates. In the pass band it keeps its level;
# above 8 kHz, what comes out is aliasing, which 16 kHz audio cannot tell from speech.
RESAMPLE = """async ([rate, freq]) => {
  const seconds = 1;
  const ctx = new OfflineAudioContext(1, rate * seconds, rate);
  await ctx.audioWorklet.addModule("/web/capture-worklet.js");
  const node = new AudioWorkletNode(ctx, "qs-capture", {
    processorOptions: { targetRate: 16000, frameSamples: 320 },
  });
  const frames = [];
  const want = Math.floor((0.9 * 16000 * seconds) / 320);
  const received = new Promise((resolve) => {
    node.port.onmessage = (e) => {
      frames.push(...new Int16Array(e.data));
      if (frames.length >= want * 320) resolve();
    };
  });
  const tone = ctx.createBuffer(1, rate * seconds, rate);
  const x = tone.getChannelData(0);
  for (let i = 0; i < x.length; i++) x[i] = 0.5 * Math.sin((2 * Math.PI * freq * i) / rate);
  const source = ctx.createBufferSource();
  source.buffer = tone;
  source.connect(node).connect(ctx.destination);
  source.start();
  await ctx.startRendering();
  await received;
  return frames;
}"""


@pytest.mark.parametrize("rate", [48000, 44100])
async def test_the_capture_worklet_resamples_cleanly(
    server: ServerProcess, chromium: Path, rate: int
) -> None:
    levels = {}
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    async with browser_page(chromium, args) as (page, _):
        await page.goto(f"{server.http}/")
        for freq in (300, 1000, 3000, 5000, 6000, 7000, 8500, 10000, 15000):
            out = np.array(await page.evaluate(RESAMPLE, [rate, freq]), np.float32) / 32768
            steady = out[1600:-1600]  # past the filter's start
            levels[freq] = 20 * np.log10(np.sqrt(2) * steady.std() / 0.5 + 1e-9)
    report = json.dumps({f: round(v, 2) for f, v in levels.items()})
    # The old filter (31 taps, linear interpolation) was 2 dB down at 6 kHz, 5 at 7 kHz,
    # and let 8.5 kHz through at -14 dB, as 7.5 kHz.
    assert all(abs(levels[f]) < 0.2 for f in (300, 1000, 3000, 5000, 6000, 7000)), report
    assert all(levels[f] < -60 for f in (8500, 10000, 15000)), report
