// Quicksilver voice demo: microphone -> /v1/voice -> transcript, reply, speech.
// Plain ES module, no build step. Protocol: docs/protocol.md.

const INPUT_RATE = 16000;
const OUTPUT_RATES = [8000, 16000, 22050, 24000, 48000];
const FRAME_SAMPLES = 320; // 20 ms at 16 kHz
const HEADER_BYTES = 8; // turn_id, seq (uint32 LE)
// a refused resume (unresumable token; a fleet whose store is down): start a new conversation
const RESUME_REFUSED = new Set(["bad_resume_token", "resume_expired", "resume_unavailable"]);
// The microphone. Echo cancellation keeps the assistant's voice from the speakers from
// barging in on itself, and changes little of what Whisper hears (0.3 dB in its log-mel
// features). The browser's noise suppression and automatic gain control are off: they
// change it by 3-6 dB and cost words that the same audio sent directly is heard with
// ("the nearest gas station" became "another risk station"). Without gain control a
// quiet microphone stays quiet: the server hears speech 20 dB below the test speech
// just as well (docs/results/2026-12-page-capture.md).
const MICROPHONE = { echoCancellation: true, noiseSuppression: false, autoGainControl: false, channelCount: 1 };
const STAGES = [
  ["endpointing_ms", "endpointing", "endpointing"],
  ["asr_ms", "ASR", "asr"],
  ["reply_ms", "reply", "reply"],
  ["tts_first_chunk_ms", "TTS first chunk", "tts"],
  ["first_audio_ms", "total", "total"],
];

const $ = (id) => document.getElementById(id);

// Read by tests and by anyone curious (devtools): counters of what happened.
const stats = (window.qsStats = {
  state: "idle",
  sentFrames: 0,
  receivedFrames: 0, // reply audio frames from the server
  playedFrames: 0, // ... that the playback worklet started to play
  droppedFrames: 0, // ... thrown away because their turn was cancelled
  underruns: 0,
  bufferedMs: 0,
  turns: 0,
  errors: [],
  actions: [], // {call_id, name, output}: every action_result the page sent
  timersRung: 0,
});

class VoiceSession {
  constructor(url) {
    this.url = url;
    this.ws = null;
    this.ctx = null;
    this.stream = null;
    this.capture = null;
    this.playback = null;
    this.outputRate = INPUT_RATE;
    this.ready = false;
    this.stopped = false;
    this.resumeToken = null;
    this.retries = 0;
    this.cancelled = new Set();
    this.turns = new Map(); // turn_id -> view
  }

  async start() {
    this.stopped = false;
    setState("connecting", "asking for the microphone");
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: MICROPHONE });
    this.ctx = new AudioContext({ latencyHint: "interactive" });
    await this.ctx.audioWorklet.addModule("/web/capture-worklet.js");
    await this.ctx.audioWorklet.addModule("/web/playback-worklet.js");
    const rate = this.ctx.sampleRate;
    this.outputRate = OUTPUT_RATES.includes(rate) ? rate : INPUT_RATE;
    this.capture = new AudioWorkletNode(this.ctx, "qs-capture", {
      processorOptions: { targetRate: INPUT_RATE, frameSamples: FRAME_SAMPLES },
    });
    this.capture.port.onmessage = (e) => this.sendAudio(e.data);
    this.ctx.createMediaStreamSource(this.stream).connect(this.capture);
    const mute = this.ctx.createGain(); // keeps the capture node pulled, silently
    mute.gain.value = 0;
    this.capture.connect(mute).connect(this.ctx.destination);
    this.playback = new AudioWorkletNode(this.ctx, "qs-playback", {
      outputChannelCount: [1],
      processorOptions: { inputRate: this.outputRate, jitterMs: 60 },
    });
    this.playback.port.onmessage = (e) => updateAudioStats(e.data);
    this.playback.connect(this.ctx.destination);
    await this.ctx.resume();
    this.connect();
  }

  connect() {
    setState(this.retries ? "reconnecting" : "connecting", `connecting to ${this.url}`);
    const ws = (this.ws = new WebSocket(this.url, voiceProtocols()));
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      const start = { type: "start", sample_rate: INPUT_RATE, client: "web", output_sample_rate: this.outputRate };
      if (this.resumeToken) start.resume_token = this.resumeToken;
      ws.send(JSON.stringify(start));
    };
    ws.onmessage = (e) => (typeof e.data === "string" ? this.onEvent(JSON.parse(e.data)) : this.onAudio(e.data));
    ws.onclose = (e) => this.onClose(e);
  }

  onClose(event) {
    this.ready = false;
    if (this.stopped) return setState("idle", "not connected");
    if (event.code === 4002 || event.code === 1009) return fail(`the server closed the session (${event.code} ${event.reason})`);
    const delay = Math.min(5000, 250 * 2 ** this.retries++);
    if (this.retries > 8) return fail(`cannot reach the server at ${this.url}; is \`quicksilver serve\` running?`);
    setState("reconnecting", `connection lost (code ${event.code}); retrying in ${(delay / 1000).toFixed(1)} s`);
    setTimeout(() => !this.stopped && this.connect(), delay);
  }

  stop() {
    this.stopped = true;
    this.ws?.close(1000, "bye");
    this.stream?.getTracks().forEach((t) => t.stop());
    this.ctx?.close();
    setState("idle", "not connected");
  }

  sendAudio(buffer) {
    if (!this.ready || this.ws.readyState !== WebSocket.OPEN) return;
    this.ws.send(buffer);
    stats.sentFrames++;
  }

  onAudio(buffer) {
    const view = new DataView(buffer);
    const turn = view.getUint32(0, true);
    stats.receivedFrames++;
    if (this.cancelled.has(turn)) return; // the worklet would drop it too
    const pcm = buffer.slice(HEADER_BYTES);
    this.playback.port.postMessage({ type: "audio", turn, pcm }, [pcm]);
    this.turn(turn).setStatus("speaking");
    setState("answering", "answering");
  }

  onEvent(msg) {
    switch (msg.type) {
      case "ready":
        this.ready = true;
        this.retries = 0;
        this.resumeToken = msg.resume_token || null;
        hideError();
        $("session").textContent = `session ${msg.session_id}${msg.resumed ? " (resumed)" : ""} · ASR ${msg.asr} · reply ${msg.reply_engine} · ${(msg.tools || []).length} tools`;
        return setState("listening", "listening");
      case "speech_started":
        this.turn(msg.turn_id).setStatus("listening");
        return setState("hearing", "hearing you");
      case "speech_stopped":
        return setState("answering", "thinking");
      case "transcript_partial":
        return setPartial(msg.text);
      case "transcript_final":
        setPartial("");
        return this.turn(msg.turn_id).setYou(msg.text || "(nothing understood)");
      case "reply_text":
        return this.turn(msg.turn_id).addReply(msg.text);
      case "action":
        return this.act(msg);
      case "reply_done":
        this.playback.port.postMessage({ type: "complete", turn: msg.turn_id });
        this.turn(msg.turn_id).done(msg.text);
        return setState("listening", "listening");
      case "reply_cancelled":
        this.cancelled.add(msg.turn_id);
        this.playback.port.postMessage({ type: "cancel", turn: msg.turn_id });
        return this.turn(msg.turn_id).cancel(msg.reason, msg.spoken_text);
      case "metrics":
        stats.turns++;
        return this.turn(msg.turn_id).metrics(msg);
      case "error":
        if (RESUME_REFUSED.has(msg.code) && this.resumeToken) {
          this.resumeToken = null; // start a new conversation on the same connection
          return this.ws.send(JSON.stringify({ type: "start", sample_rate: INPUT_RATE, client: "web", output_sample_rate: this.outputRate }));
        }
        return showError(`${msg.code}: ${msg.message}`);
    }
  }

  // The assistant calls a tool: carry it out, show it as a card in its turn, answer.
  act(msg) {
    const card = this.turn(msg.turn_id).addAction(msg);
    const output = device.carryOut(msg, card);
    card.setResult(output);
    const result = { type: "action_result", call_id: msg.call_id, output };
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(result));
    stats.actions.push({ call_id: msg.call_id, name: msg.name, output });
  }

  turn(id) {
    if (!this.turns.has(id)) this.turns.set(id, new TurnView(id));
    return this.turns.get(id);
  }
}

// What the page does with actions, like the Python clients (clients/actions.py): one
// countdown timer (timer.set starts or replaces it, timer.cancel stops it, a chime when
// it rings); any other tool is shown and answered "done". It belongs to the page, not
// to a connection, so a timer keeps running through a reconnection.
class Device {
  constructor() {
    this.timer = null; // {card, seconds, endsAt, tick, ring}
  }

  carryOut(msg, card) {
    const args = msg.arguments;
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      return card.fail(`error: ${msg.name}: arguments must be an object`);
    }
    switch (msg.name) {
      case "timer.set":
        return this.setTimer(args.seconds, card);
      case "timer.cancel":
        return this.cancelTimer(card);
      default:
        card.setNote("done");
        return "done";
    }
  }

  leftS() {
    return this.timer ? Math.max(0, (this.timer.endsAt - Date.now()) / 1000) : null;
  }

  setTimer(seconds, card) {
    if (!Number.isInteger(seconds) || seconds < 1) {
      return card.fail("error: timer.set needs seconds, a whole number of at least 1");
    }
    const left = this.leftS();
    this.stopTimer("replaced by a newer timer");
    const endsAt = Date.now() + seconds * 1000;
    const timer = { card, seconds, endsAt };
    timer.tick = setInterval(() => card.countdown(endsAt), 250);
    timer.ring = setTimeout(() => this.ring(timer), seconds * 1000);
    this.timer = timer;
    card.countdown(endsAt);
    card.setNote(`ends at ${clock(endsAt)}`);
    const said = `Timer set for ${spokenDuration(seconds)}`;
    return left === null ? `${said}.` : `${said}, replacing one with ${spokenDuration(left)} left.`;
  }

  cancelTimer(card) {
    const left = this.leftS();
    if (left === null) {
      card.setNote("no timer was running");
      return "No timer was running.";
    }
    this.stopTimer(`cancelled with ${countdownText(left)} left`);
    card.setNote(`cancelled the timer with ${countdownText(left)} left`);
    return `Timer cancelled with ${spokenDuration(left)} left.`;
  }

  stopTimer(why) {
    const timer = this.timer;
    if (!timer) return;
    clearInterval(timer.tick);
    clearTimeout(timer.ring);
    this.timer = null;
    timer.card.stopped(why);
  }

  ring(timer) {
    clearInterval(timer.tick);
    this.timer = null;
    stats.timersRung++;
    timer.card.rang(Date.now(), timer.seconds);
    chime(session?.ctx);
  }
}

const device = new Device();

function spokenDuration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const parts = [[Math.floor(s / 3600), "hour"], [Math.floor((s % 3600) / 60), "minute"], [s % 60, "second"]];
  const words = parts.filter(([n]) => n).map(([n, unit]) => `${n} ${unit}${n === 1 ? "" : "s"}`);
  return words.join(" ") || "0 seconds";
}

function countdownText(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  const [h, m, sec] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60), s % 60];
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

// Two tones, twice (E6, C6), through the page's audio context when it is running.
function chime(ctx) {
  if (!ctx || ctx.state !== "running") return;
  const t0 = ctx.currentTime + 0.02;
  [1318.5, 1046.5, 1318.5, 1046.5].forEach((hz, i) => {
    const osc = ctx.createOscillator();
    const gain = ctx.createGain();
    const at = t0 + i * 0.16;
    osc.frequency.value = hz;
    gain.gain.setValueAtTime(0, at);
    gain.gain.linearRampToValueAtTime(0.3, at + 0.01);
    gain.gain.setValueAtTime(0.3, at + 0.11);
    gain.gain.linearRampToValueAtTime(0, at + 0.12);
    osc.connect(gain).connect(ctx.destination);
    osc.start(at);
    osc.stop(at + 0.13);
  });
}

function argumentsText(args) {
  const entries = Object.entries(args && typeof args === "object" ? args : {});
  return entries.length ? entries.map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join(", ") : "no arguments";
}

class ActionCard {
  constructor(msg) {
    const timer = msg.name.startsWith("timer.");
    this.node = el("div", "action");
    this.node.dataset.call = msg.call_id;
    this.node.dataset.name = msg.name;
    this.node.dataset.state = "done";
    const head = el("div", "action-head");
    head.append(el("span", "action-kind", timer ? "Timer" : "Action"), el("code", "action-name", msg.name));
    head.append(el("span", "action-args", argumentsText(msg.arguments)));
    this.main = el("div", "action-countdown");
    this.main.hidden = true;
    this.note = el("div", "action-note");
    this.result = el("div", "action-result");
    this.node.append(head, this.main, this.note, this.result);
  }
  setNote(text) { this.note.textContent = text; }
  setResult(output) { this.result.textContent = `answered: ${typeof output === "string" ? output : JSON.stringify(output)}`; }
  fail(output) {
    this.node.dataset.state = "error";
    this.setNote("could not be done");
    return output;
  }
  countdown(endsAt) {
    this.node.dataset.state = "running";
    this.main.hidden = false;
    this.main.textContent = countdownText((endsAt - Date.now()) / 1000);
  }
  rang(at, seconds) {
    this.node.dataset.state = "rang";
    this.main.textContent = "0:00";
    this.setNote(`done: rang at ${clock(at)}, after ${spokenDuration(seconds)}`);
  }
  stopped(why) {
    this.node.dataset.state = "stopped";
    this.setNote(why);
  }
}

class TurnView {
  constructor(id) {
    this.node = $("turn-template").content.firstElementChild.cloneNode(true);
    this.node.dataset.turn = id;
    this.you = this.node.querySelector(".you .text");
    this.bot = this.node.querySelector(".bot .text");
    this.status = this.node.querySelector(".status");
    this.latency = this.node.querySelector(".latency");
    this.actions = this.node.querySelector(".actions");
    this.sentences = [];
    $("turns").append(this.node);
  }
  setYou(text) { this.you.textContent = text; }
  addAction(msg) {
    const card = new ActionCard(msg);
    this.actions.append(card.node);
    return card;
  }
  setStatus(text) { this.status.textContent = text; }
  addReply(text) { this.sentences.push(text); this.bot.textContent = this.sentences.join(" "); }
  done(text) { if (text) this.bot.textContent = text; this.setStatus(text ? "" : "(no reply)"); }
  cancel(reason, spoken) {
    this.node.classList.add("cancelled");
    this.setStatus(`interrupted (${reason.replace("_", "-")}); heard: “${spoken}”`);
  }
  metrics(m) {
    const values = STAGES.map(([key]) => m[key]);
    const scale = Math.max(1, ...values.filter((v) => v != null));
    this.latency.replaceChildren();
    for (const [key, label, cls] of STAGES) {
      const v = m[key];
      const bar = el("div", "bar " + cls);
      bar.style.width = v == null ? "0" : `${(100 * v) / scale}%`;
      const track = el("div", "track");
      track.append(bar);
      this.latency.append(el("span", "stage", label), track, el("span", "ms", v == null ? "–" : `${Math.round(v)} ms`));
    }
    const note = m.speculative ? "ASR and reply ran during the trailing silence (speculative): they overlap endpointing." : "";
    const acted = m.action ? ` The call to ${m.action} took ${m.action_passes} passes.` : "";
    this.latency.append(el("span", "note", `${note} ${m.reply_tokens} tokens, ${m.forward_passes} forward passes.${acted}`.trim()));
    this.latency.hidden = false;
  }
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  node.className = cls;
  if (text != null) node.textContent = text;
  return node;
}

function setState(state, text) {
  stats.state = state;
  const node = $("state");
  node.dataset.state = state;
  node.textContent = text;
}

function setPartial(text) { $("partial").textContent = text || "\u00a0"; }

function showError(text) {
  stats.errors.push(text);
  const node = $("error");
  node.textContent = text;
  node.hidden = false;
}

function hideError() { $("error").hidden = true; }

function fail(text) {
  showError(text);
  setState("error", "disconnected");
  $("toggle").textContent = "Start talking";
  $("toggle").classList.remove("stop");
}

function updateAudioStats(s) {
  stats.playedFrames = s.played;
  stats.droppedFrames = s.dropped;
  stats.underruns = s.underruns;
  stats.bufferedMs = s.bufferedMs;
  $("audio-stats").textContent = `audio: ${stats.receivedFrames} frames received, ${s.played} played, ${s.dropped} dropped, ${s.bufferedMs} ms buffered`;
}

function voiceUrl() {
  const override = new URLSearchParams(location.search).get("ws");
  if (override) return override;
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/voice`;
}

// A page opened as /?token=<client token> passes it the one way a browser can: as a
// WebSocket subprotocol (docs/security.md). A token opens one session.
function voiceProtocols() {
  const token = new URLSearchParams(location.search).get("token");
  return token ? ["quicksilver.v1", `quicksilver.token.${token}`] : [];
}

let session = null;
$("toggle").addEventListener("click", async () => {
  const button = $("toggle");
  if (session && !session.stopped) {
    session.stop();
    button.textContent = "Start talking";
    button.classList.remove("stop");
    return;
  }
  button.textContent = "Stop";
  button.classList.add("stop");
  session = window.qsSession = new VoiceSession(voiceUrl());
  try {
    await session.start();
  } catch (err) {
    session.stopped = true;
    fail(err.name === "NotAllowedError" ? "microphone permission was refused" : `cannot start: ${err.message || err}`);
  }
});
