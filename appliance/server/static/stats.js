// Rolling figures: the last N samples and their percentiles (not the last value, which
// jumps with every frame).

export class Rolling {
  constructor(size = 300) {
    this.size = size;
    this.values = [];
  }

  push(x) {
    if (!Number.isFinite(x)) return;
    this.values.push(x);
    if (this.values.length > this.size) this.values.shift();
  }

  clear() { this.values = []; }

  get count() { return this.values.length; }

  /** The q-quantile (0..1) by the nearest rank, or null with no sample. */
  quantile(q) {
    if (!this.values.length) return null;
    const sorted = [...this.values].sort((a, b) => a - b);
    return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
  }

  /** "p50 41 ms · p95 63 ms", or "–" with no sample. */
  summary() {
    if (!this.values.length) return "–";
    return `p50 ${Math.round(this.quantile(0.5))} ms · p95 ${Math.round(this.quantile(0.95))} ms`;
  }
}

/** Frames (or messages) per second over a sliding window of arrival times. */
export class Rate {
  constructor(windowMs = 3000) {
    this.windowMs = windowMs;
    this.times = [];
  }

  tick(now = performance.now()) {
    this.times.push(now);
    while (this.times.length && this.times[0] < now - this.windowMs) this.times.shift();
  }

  clear() { this.times = []; }

  perSecond(now = performance.now()) {
    while (this.times.length && this.times[0] < now - this.windowMs) this.times.shift();
    return this.times.length / (this.windowMs / 1000);
  }
}
