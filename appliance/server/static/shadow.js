// A stream's shadow (docs/shadow.md): the candidate workflow run beside the live one on
// the same frames. The newest frame both compared, drawn twice side by side (the live
// detections on the left, the candidate's on the right) or both on one canvas; the
// detections the candidate missed and its extra ones marked; the agreement so far and
// the recent misses. The frame and both results come in one answer (/shadow/frame), so
// the image and the two overlays are always the same frame. Hidden without a shadow.
// Each canvas says what it drew in data attributes (seq, boxes, marked, mode): for tests
// and anyone checking.

import { $, apiJson, el, say, streamPath } from "./api.js";
import { drawBox } from "./overlay.js";

const EVERY_MS = 2000;
const DASH = [6, 4];
const MISSED = { color: "#dc2626", dash: DASH, note: "missed" }; // live only
const EXTRA = { color: "#f97316", dash: DASH, note: "extra" }; // candidate only
// On one canvas a matched pair is two boxes on top of each other: one label is enough.
const LIVE = { color: "#22c55e", note: "live" };
const CANDIDATE = { color: "#3b82f6", bare: true };

export class ShadowPanel {
  constructor(id) {
    this.id = id;
    this.timer = null;
    this.busy = false; // a refresh slower than EVERY_MS is not overtaken by the next
    this.closed = false;
    this.merged = false;
    this.frame = null; // the newest /shadow/frame answer and its decoded image
    this.image = null;
  }

  open() {
    this.show(false);
    this.setMerged(false);
    $("shadow-misses").replaceChildren();
    this.refresh();
    this.timer = setInterval(() => { if (!document.hidden) this.refresh(); }, EVERY_MS);
  }

  close() {
    this.closed = true;
    clearInterval(this.timer);
    this.show(false);
  }

  /** Side by side, or both on one canvas. */
  toggle() { this.setMerged(!this.merged); }

  setMerged(on) {
    this.merged = on;
    const button = $("shadow-toggle");
    button.textContent = on ? "Side by side" : "Overlay on one frame";
    button.setAttribute("aria-pressed", String(on));
    this.draw();
  }

  show(on) { $("shadow-panel").hidden = !on; }

  async refresh() {
    if (this.busy || this.closed) return;
    this.busy = true;
    try {
      await this.load();
    } finally {
      this.busy = false;
    }
  }

  async load() {
    const path = `${streamPath(this.id)}/shadow`;
    let report, frame;
    try {
      report = await apiJson("GET", path);
      frame = await apiJson("GET", `${path}/frame`).catch((err) => {
        if (err.status === 404) return null; // none compared yet (or stopped meanwhile)
        throw err;
      });
    } catch (err) {
      if (this.closed) return;
      if (err.status === 404) this.show(false); // no shadow: nothing to show
      else if (err.status !== 401) say("shadow-status", `Shadow: ${err.message}`);
      return;
    }
    if (frame) this.image = await decoded(frame.image);
    if (this.closed) return;
    this.frame = frame;
    say("shadow-status", this.frame ? "" : "No frame compared yet.");
    this.show(true);
    drawReport(report);
    this.draw();
  }

  draw() {
    const frame = this.frame;
    $("shadow-pair").hidden = !frame;
    if (!frame) return;
    $("shadow-candidate-figure").hidden = this.merged;
    const live = { message: frame.live, marked: frame.missed, plain: {}, mark: MISSED };
    const candidate = { message: frame.candidate, marked: frame.extra, plain: {}, mark: EXTRA };
    const shown = (workflow) => `workflow ${workflow || "?"}, frame ${frame.seq}`;
    if (this.merged) {
      const drawn = drawFrame($("shadow-live"), this.image, frame, "merged", [
        { ...live, plain: LIVE }, { ...candidate, plain: CANDIDATE }]);
      say("shadow-live-caption", `Live (green, ${shown(frame.live.workflow)}) and candidate `
        + `(blue, ${shown(frame.candidate.workflow)}): ${drawn.boxes} boxes, `
        + `${drawn.marked} missed or extra`);
      return;
    }
    const left = drawFrame($("shadow-live"), this.image, frame, "live", [live]);
    const right = drawFrame($("shadow-candidate"), this.image, frame, "candidate", [candidate]);
    say("shadow-live-caption", `Live, ${shown(frame.live.workflow)}: ${left.boxes} boxes, `
      + `${left.marked} missed by the candidate`);
    say("shadow-candidate-caption", `Candidate, ${shown(frame.candidate.workflow)}: `
      + `${right.boxes} boxes, ${right.marked} extra`);
  }
}

async function decoded(url) {
  const image = new Image();
  image.src = url;
  await image.decode();
  return image;
}

/** Rows with a box of every output that lists them, each with whether it is marked
 * (`marked`: output -> row numbers, the answer's `missed` or `extra`). */
function boxRows(message, marked) {
  return Object.entries(message.outputs ?? {}).filter(([, rows]) => Array.isArray(rows))
    .flatMap(([name, rows]) => rows.map((row, i) => [row, marked[name]?.includes(i) ?? false]))
    .filter(([row]) => Array.isArray(row?.box) && row.box.length === 4);
}

/** The frame, scaled to the canvas's width, and each layer's boxes on it (`plain` or
 * `mark` style); what was drawn is put on the canvas as data attributes and returned. */
function drawFrame(canvas, image, frame, mode, layers) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || frame.width;
  const h = (w * frame.height) / frame.width;
  canvas.width = Math.round(w * dpr); // also clears it
  canvas.height = Math.round(h * dpr);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.drawImage(image, 0, 0, w, h);
  ctx.lineWidth = 2;
  ctx.font = "600 13px system-ui, sans-serif";
  const s = w / frame.width;
  const drawn = { boxes: 0, marked: 0 };
  for (const { message, marked, plain, mark } of layers) {
    for (const [row, isMarked] of boxRows(message, marked)) {
      const [x1, y1, x2, y2] = row.box.map((v) => v * s);
      drawBox(ctx, row, [x1, y1], [x2, y2], isMarked ? mark : plain);
      drawn.boxes += 1;
      drawn.marked += isMarked ? 1 : 0;
    }
  }
  Object.assign(canvas.dataset, { seq: frame.seq, mode, ...drawn });
  return drawn;
}

const fixed = (x, digits = 3) => (x === null || x === undefined ? "–" : x.toFixed(digits));

/** The agreement with its interval, and the newest misses and extras as a list. */
function drawReport(report) {
  const c = report.comparison;
  const [low, high] = c.agreement_interval;
  say("shadow-workflow", report.workflow);
  const failed = report.last_error ? ` The candidate failed on ${report.failed} frames: `
    + `${report.last_error}` : "";
  say("shadow-summary", (c.frames ? `Agreement ${fixed(c.agreement)} (95 % interval `
    + `${fixed(low)}–${fixed(high)}) over ${c.frames} frames: ${c.matched} matched, `
    + `${c.missed} missed, ${c.extra} extra (IoU ${c.iou}).` : "No frame compared yet.")
    + failed);
  const items = c.examples.map((e) => {
    const what = `${e.kind} on frame ${e.seq}: ${e.output} ${e.label} ${fixed(e.confidence, 2)}`
      + ` at [${e.box.map((v) => Math.round(v)).join(", ")}]`;
    return el("li", what, e.kind);
  });
  $("shadow-misses").replaceChildren(...(items.length ? items : [el("li", "None yet.", "empty")]));
}
