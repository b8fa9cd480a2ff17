// Microphone capture: the device rate in, 16 kHz PCM16 frames out (posted to the page).
//
// Resampling: a windowed-sinc low-pass (cut-off just under 8 kHz) on every input
// sample, then linear interpolation of the filtered signal at the 16 kHz instants.
// Whisper hears 16 kHz; without the low-pass, 8-24 kHz content would alias into it.

const TAPS = 31;

function lowPass(cutoff) {
  // cutoff as a fraction of the input rate; Blackman window
  const h = new Float32Array(TAPS);
  const m = (TAPS - 1) / 2;
  let sum = 0;
  for (let i = 0; i < TAPS; i++) {
    const x = i - m;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    const w = 0.42 - 0.5 * Math.cos((2 * Math.PI * i) / (TAPS - 1)) + 0.08 * Math.cos((4 * Math.PI * i) / (TAPS - 1));
    h[i] = sinc * w;
    sum += h[i];
  }
  for (let i = 0; i < TAPS; i++) h[i] /= sum;
  return h;
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate = 16000, frameSamples = 320 } = options.processorOptions || {};
    this.step = sampleRate / targetRate; // input samples per output sample
    this.filter = this.step > 1 ? lowPass((0.45 * targetRate) / sampleRate) : null;
    this.history = new Float32Array(TAPS);
    this.hpos = 0;
    this.prev = 0; // last filtered sample
    this.t = 0; // position of the next output sample, in input samples after `prev`
    this.frame = new Int16Array(frameSamples);
    this.n = 0;
  }

  filtered(x) {
    if (!this.filter) return x;
    this.history[this.hpos] = x;
    this.hpos = (this.hpos + 1) % TAPS;
    let y = 0;
    for (let i = 0; i < TAPS; i++) y += this.filter[i] * this.history[(this.hpos + i) % TAPS];
    return y;
  }

  emit(value) {
    const v = Math.max(-1, Math.min(1, value));
    this.frame[this.n++] = v < 0 ? v * 32768 : v * 32767;
    if (this.n === this.frame.length) {
      const out = this.frame.slice();
      this.port.postMessage(out.buffer, [out.buffer]);
      this.n = 0;
    }
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    for (let i = 0; i < input.length; i++) {
      const y = this.filtered(input[i]);
      // output instants between prev (at 0) and y (at 1)
      while (this.t <= 1) {
        this.emit(this.prev + (y - this.prev) * this.t);
        this.t += this.step;
      }
      this.t -= 1;
      this.prev = y;
    }
    return true;
  }
}

registerProcessor("qs-capture", CaptureProcessor);
