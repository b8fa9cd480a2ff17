// Microphone capture: the device rate in, 16 kHz PCM16 frames out (posted to the page).
//
// Resampling is band-limited interpolation (J. O. Smith, "Digital Audio Resampling",
// https://ccrma.stanford.edu/~jos/resample/): every output sample is the input weighted
// by a Kaiser-windowed sinc centred on the output instant. The low-pass is flat to
// 7 kHz and 70 dB down at 8 kHz, so nothing above 8 kHz aliases into what Whisper hears
// (a 31-tap filter with linear interpolation was 2 dB down at 6 kHz, 5 dB at 7 kHz, and
// passed 8.5 kHz at -14 dB, as 7.5 kHz). The two rates have a rational ratio (44.1 kHz
// -> 16 kHz: 441 inputs per 160 outputs), so the output instants fall on a few
// fractional positions between input samples (160 there, 1 at 48 kHz), whose kernels
// are computed once.

const PASS = 0.88; // pass-band edge, as a fraction of the lower rate's Nyquist frequency
const STOP = 1.0; // stop-band edge: the Nyquist frequency of the lower rate
const STOP_DB = 70;
const MAX_PHASES = 512; // past this many fractional positions, round to the nearest

function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

// Zeroth-order modified Bessel function of the first kind (series), for the window.
function bessel0(x) {
  let sum = 1;
  let term = 1;
  for (let k = 1; k < 50 && term > 1e-12 * sum; k++) {
    term *= (x / (2 * k)) ** 2;
    sum += term;
  }
  return sum;
}

// Windowed sinc at offset t (input samples) from the output instant; cutoff fc and
// the window half-width `half`, both in input samples. Kaiser's beta and length
// formulas: Oppenheim & Schafer, Discrete-Time Signal Processing, 7.6.
function kernel(frac, fc, half, beta) {
  const h = new Float32Array(2 * half);
  let sum = 0;
  for (let n = 0; n < h.length; n++) {
    const t = n - half + 1 - frac; // input sample (i0 + n - half + 1) sits t from the instant
    const u = t / half;
    const sinc = t === 0 ? 2 * fc : Math.sin(2 * Math.PI * fc * t) / (Math.PI * t);
    h[n] = Math.abs(u) < 1 ? (sinc * bessel0(beta * Math.sqrt(1 - u * u))) / bessel0(beta) : 0;
    sum += h[n];
  }
  for (let n = 0; n < h.length; n++) h[n] /= sum; // unit gain at 0 Hz
  return h;
}

class Resampler {
  constructor(inRate, outRate) {
    const g = gcd(inRate, outRate);
    this.a = inRate / g; // input samples per `b` output samples
    this.b = outRate / g;
    const nyquist = Math.min(inRate, outRate) / 2;
    const fc = ((PASS + STOP) / 2) * (nyquist / inRate);
    const width = (STOP - PASS) * (nyquist / inRate);
    this.half = Math.ceil((STOP_DB - 8) / (2.285 * 2 * Math.PI * width) / 2);
    const beta = 0.1102 * (STOP_DB - 8.7);
    this.phases = Math.min(this.b, MAX_PHASES);
    this.kernels = [];
    for (let j = 0; j <= this.phases; j++) this.kernels.push(kernel(j / this.phases, fc, this.half, beta));
    this.buf = new Float32Array(2 * this.half + 4096);
    this.len = this.half - 1; // zeros before the first sample: the first output is centred on it
    this.pos = this.half - 1; // buffer index of the input sample at or before the next output instant
    this.phase = 0; // the next output instant is at pos + phase / b
  }

  // Feeds input samples; calls emit(y) for every output sample they complete.
  push(input, emit) {
    if (this.len + input.length > this.buf.length) this.compact();
    if (this.len + input.length > this.buf.length) this.grow(this.len + input.length);
    this.buf.set(input, this.len);
    this.len += input.length;
    const buf = this.buf;
    while (this.pos + this.half < this.len) {
      const j = this.phases === this.b ? this.phase : Math.round((this.phase * this.phases) / this.b);
      const h = this.kernels[j];
      const o = this.pos - this.half + 1;
      let y = 0;
      for (let n = 0; n < h.length; n++) y += h[n] * buf[o + n];
      emit(y);
      this.phase += this.a;
      this.pos += Math.floor(this.phase / this.b);
      this.phase %= this.b;
    }
  }

  grow(size) {
    const buf = new Float32Array(2 * size);
    buf.set(this.buf.subarray(0, this.len));
    this.buf = buf;
  }

  compact() {
    const keep = this.pos - this.half + 1; // the oldest sample the next output reads
    this.buf.copyWithin(0, keep, this.len);
    this.len -= keep;
    this.pos -= keep;
  }
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate = 16000, frameSamples = 320 } = options.processorOptions || {};
    this.resampler = sampleRate === targetRate ? null : new Resampler(sampleRate, targetRate);
    this.frame = new Int16Array(frameSamples);
    this.n = 0;
    this.emit = (value) => this.emitSample(value);
  }

  emitSample(value) {
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
    if (this.resampler) this.resampler.push(input, this.emit);
    else for (let i = 0; i < input.length; i++) this.emitSample(input[i]);
    return true;
  }
}

registerProcessor("qs-capture", CaptureProcessor);
