// Reply playback: server frames in (PCM16 at the reply rate, tagged with their turn),
// the device rate out, through a small jitter buffer.
//
// Playback starts once `jitterMs` of audio is buffered (or the turn's audio is all
// there), so network jitter does not click. A cancelled turn (reply_cancelled, i.e.
// barge-in) is dropped at once: its queued frames are thrown away and any late ones
// are ignored. Stats go back to the page about every 100 ms and after every cancel.

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { inputRate = 16000, jitterMs = 60 } = options.processorOptions || {};
    this.step = inputRate / sampleRate; // input samples per output sample
    this.jitter = (jitterMs * inputRate) / 1000;
    this.queue = []; // {turn, data: Float32Array, started}
    this.pos = 0; // fractional read position in queue[0].data
    this.buffered = 0; // input samples queued
    this.playing = false;
    this.cancelled = new Set();
    this.complete = new Set(); // turns whose audio has all arrived (reply_done)
    this.stats = { received: 0, played: 0, dropped: 0, underruns: 0 };
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    if (msg.type === "audio") {
      this.stats.received++;
      if (this.cancelled.has(msg.turn)) {
        this.stats.dropped++;
        return;
      }
      const pcm = new Int16Array(msg.pcm);
      const data = new Float32Array(pcm.length);
      for (let i = 0; i < pcm.length; i++) data[i] = pcm[i] / 32768;
      this.queue.push({ turn: msg.turn, data, started: false });
      this.buffered += data.length;
    } else if (msg.type === "cancel") {
      this.cancelled.add(msg.turn);
      const keep = this.queue.filter((f) => f.turn !== msg.turn);
      this.stats.dropped += this.queue.length - keep.length;
      if (this.queue.length && this.queue[0].turn === msg.turn) this.pos = 0;
      this.queue = keep;
      this.buffered = keep.reduce((n, f) => n + f.data.length, 0) - this.pos;
      if (!this.queue.length) this.playing = false;
      this.report();
    } else if (msg.type === "complete") {
      this.complete.add(msg.turn);
    }
  }

  report() {
    this.port.postMessage({
      ...this.stats,
      bufferedMs: Math.round((this.buffered / (this.step * sampleRate)) * 1000),
      playing: this.playing,
    });
    this.sinceReport = 0;
  }

  sampleAt(k) {
    // input sample k positions after the head's current index, across frames
    let i = Math.floor(this.pos) + k;
    for (const f of this.queue) {
      if (i < f.data.length) return f.data[i];
      i -= f.data.length;
    }
    return 0;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queue.length) {
      const head = this.queue[0].turn;
      this.playing = this.buffered >= this.jitter || this.complete.has(head);
    }
    for (let j = 0; j < out.length; j++) {
      if (!this.playing || !this.queue.length) {
        out[j] = 0;
        continue;
      }
      const head = this.queue[0];
      if (!head.started) {
        head.started = true;
        this.stats.played++;
      }
      const frac = this.pos - Math.floor(this.pos);
      out[j] = this.sampleAt(0) + (this.sampleAt(1) - this.sampleAt(0)) * frac;
      this.pos += this.step;
      this.buffered -= this.step;
      while (this.queue.length && this.pos >= this.queue[0].data.length) {
        this.pos -= this.queue[0].data.length;
        this.queue.shift();
      }
      if (!this.queue.length) {
        this.playing = false; // ran dry: buffer up again before the next sound
        this.buffered = 0;
        this.pos = 0;
        if (!this.complete.has(head.turn)) this.stats.underruns++;
      }
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if ((this.sinceReport += out.length) >= sampleRate / 10) this.report();
    return true;
  }
}

registerProcessor("qs-playback", PlaybackProcessor);
