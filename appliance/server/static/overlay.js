// Predictions drawn by the page on a canvas over the raw video: boxes, labels, track
// ids, and the workflow's lines and zones. Each presented frame is matched to its own
// result: the `frames` channel says which result (capture time) each RTP timestamp
// carries, requestVideoFrameCallback gives the presented frame's RTP timestamp, and the
// `predictions` channel's message with that capture time is the one drawn. A frame
// whose predictions have not arrived yet gets no boxes (never another frame's).
// After drawing, the canvas dispatches an "overlay" event: {rtp, seq, boxes} in the
// frame's own pixels, for tests and anyone checking what was drawn. drawBox also draws
// a shadow's two sides (shadow.js).

const KEEP = 240; // frames and messages remembered (16 s at 15 fps): enough for any lag
const COLORS = ["#22c55e", "#3b82f6", "#f97316", "#e11d48", "#a855f7", "#eab308"];

const key = (captureTime) => captureTime.toFixed(6);

function remember(map, k, v) {
  map.set(k, v);
  if (map.size > KEEP) map.delete(map.keys().next().value);
}

export class Overlay {
  constructor(canvas, video) {
    this.canvas = canvas;
    this.video = video;
    this.frames = new Map(); // RTP timestamp -> {seq, capture_time, width, height}
    this.predictions = new Map(); // capture time -> predictions message
    this.regions = [];
    this.enabled = false;
    this.current = null; // the frame on screen
    new ResizeObserver(() => this.draw()).observe(canvas); // a resized canvas is blank
  }

  reset() {
    this.frames.clear();
    this.predictions.clear();
    this.current = null;
    this.draw();
  }

  setRegions(regions) { this.regions = regions; this.draw(); }

  setEnabled(on) { this.enabled = on; this.draw(); }

  addFrame(info) { remember(this.frames, info.rtp_timestamp, info); }

  addPrediction(message) {
    const k = key(message.capture_time);
    remember(this.predictions, k, message);
    if (this.current && key(this.current.capture_time) === k) this.draw(); // it was late
  }

  /** A frame was presented: the info its RTP timestamp maps to (or null), drawn. */
  presented(metadata) {
    // Chromium reports the RTP timestamp after a round trip through microseconds: one
    // tick (11 µs) either way happens on about half the frames; frames are thousands of
    // ticks apart.
    const rtp = metadata.rtpTimestamp;
    const info = this.frames.get(rtp) ?? this.frames.get((rtp + 1) >>> 0)
      ?? this.frames.get((rtp - 1) >>> 0) ?? null;
    this.current = info && { ...info, rtp: metadata.rtpTimestamp };
    this.draw();
    return info;
  }

  /** The predictions of the frame on screen, once they have arrived (else null). */
  onScreen() {
    return this.current ? this.predictions.get(key(this.current.capture_time)) ?? null : null;
  }

  /** Where the video's picture is inside the element (object-fit: contain). */
  box() {
    const w = this.canvas.clientWidth;
    const h = this.canvas.clientHeight;
    const vw = this.video.videoWidth || w;
    const vh = this.video.videoHeight || h;
    const scale = Math.min(w / vw, h / vh);
    return { w, h, x: (w - vw * scale) / 2, y: (h - vh * scale) / 2, pw: vw * scale,
      ph: vh * scale };
  }

  draw() {
    const canvas = this.canvas;
    const ctx = canvas.getContext("2d");
    const b = this.box();
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(b.w * dpr) || canvas.height !== Math.round(b.h * dpr)) {
      canvas.width = Math.round(b.w * dpr);
      canvas.height = Math.round(b.h * dpr);
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, b.w, b.h);
    const frame = this.current;
    if (!this.enabled || !frame) return;
    const sx = b.pw / frame.width;
    const sy = b.ph / frame.height;
    const at = ([x, y]) => [b.x + x * sx, b.y + y * sy];
    ctx.lineWidth = 2;
    ctx.font = "600 13px system-ui, sans-serif";
    for (const region of this.regions) {
      const norm = region.units === "norm";
      drawRegion(ctx, region, region.points.map(([x, y]) => at(norm ? [x * frame.width,
        y * frame.height] : [x, y])));
    }
    const message = this.predictions.get(key(frame.capture_time));
    const boxes = message ? detections(message).map((row) => {
      drawBox(ctx, row, at(row.box.slice(0, 2)), at(row.box.slice(2, 4)));
      return row.box;
    }) : null;
    canvas.dispatchEvent(new CustomEvent("overlay", { detail: { rtp: frame.rtp,
      seq: frame.seq, capture_time: frame.capture_time, boxes } }));
  }
}

/** Every row with a box, from every output that is a list of them. */
export function detections(message) {
  return Object.values(message.outputs ?? {}).filter(Array.isArray)
    .flatMap((rows) => rows.filter((r) => Array.isArray(r?.box) && r.box.length === 4));
}

/** One detection row's box and label, at canvas points [x1, y1], [x2, y2]. The style
 * (all optional): `color` (else one per track or class), `dash` (a line dash), `note`
 * (a word before the label), `bare` (no label). */
export function drawBox(ctx, row, [x1, y1], [x2, y2], { color, dash = [], note, bare } = {}) {
  const stroke = color ?? COLORS[(row.track_id ?? row.class_id ?? 0) % COLORS.length];
  ctx.strokeStyle = stroke;
  ctx.setLineDash(dash);
  ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
  ctx.setLineDash([]);
  if (bare) return;
  const parts = [...(note ? [note] : []), row.class ?? `class ${row.class_id}`];
  if (row.track_id !== undefined) parts.push(`#${row.track_id}`);
  if (typeof row.confidence === "number") parts.push(row.confidence.toFixed(2));
  label(ctx, parts.join(" "), x1, y1, stroke);
}

function drawRegion(ctx, region, points) {
  if (points.length < 2) return;
  ctx.strokeStyle = region.kind === "zone" ? "#eab308" : "#f43f5e";
  ctx.setLineDash(region.kind === "zone" ? [6, 4] : []);
  ctx.beginPath();
  ctx.moveTo(...points[0]);
  for (const p of points.slice(1)) ctx.lineTo(...p);
  if (region.kind === "zone") ctx.closePath();
  ctx.stroke();
  ctx.setLineDash([]);
  label(ctx, region.block, points[0][0], points[0][1], ctx.strokeStyle);
}

function label(ctx, text, x, y, color) {
  const width = ctx.measureText(text).width + 8;
  const top = Math.max(0, y - 18);
  ctx.fillStyle = color;
  ctx.fillRect(x, top, width, 18);
  ctx.fillStyle = "#000";
  ctx.fillText(text, x + 4, top + 13);
}
