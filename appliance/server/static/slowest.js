// A stream's slowest frames of a recent period (GET /v1/streams/{id}/slowest, docs/api.md),
// refreshed every few seconds. Each row opens its frame's trace (the frame and its
// neighbours, GET .../frames/{seq}/trace), fetched with the token: drawn here as a
// timeline (a row per thread, a bar per span, the frame's own workflow.run marked) and
// offered as a file for ui.perfetto.dev. A frame the list may not hold opens the same way
// from its own address, /streams/{id}/frames/{seq} (a Grafana exemplar's link: openFrame).
// The list and the timeline say what they show in data attributes (seq, bars, frame): for
// tests and anyone checking.

import { $, api, apiJson, el, say, streamPath } from "./api.js";

const EVERY_MS = 3000;
const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 1000; // the timeline's viewBox: the thread names, then the bars
const LABEL = 190;
const LANE = 14; // a nesting level's height
const GAP = 6; // between threads
const TOP = 16; // the time axis's line
const TRACE_PATH = /^\/v1\/streams\/[^/]+\/frames\/\d+\/trace$/; // only our own API's

export class SlowestPanel {
  constructor(id) {
    this.id = id;
    this.timer = null;
    this.busy = false; // a refresh slower than EVERY_MS is not overtaken by the next
    this.closed = false;
    this.frames = new Map(); // seq -> the newest answer's row for it
    this.rows = new Map(); // seq -> its <tr>, kept while listed (a click is not lost)
    this.opening = 0; // bumped per click: a late trace does not replace a newer one
    this.shown = null; // the frame the page's address named, once shown (or its error)
  }

  open() {
    $("slowest").tBodies[0].replaceChildren();
    say("slowest-status", "");
    say("frame-trace-status", "");
    $("frame-trace-panel").hidden = true;
    $("slowest-since").onchange = () => this.refresh();
    this.refresh();
    this.timer = setInterval(() => { if (!document.hidden) this.refresh(); }, EVERY_MS);
  }

  close() {
    this.closed = true;
    clearInterval(this.timer);
    $("slowest-since").onchange = null;
    forgetLink();
  }

  async refresh() {
    if (this.busy || this.closed) return;
    this.busy = true;
    try {
      const since = encodeURIComponent($("slowest-since").value);
      const report = await apiJson("GET", `${streamPath(this.id)}/slowest?since=${since}`);
      if (!this.closed) this.draw(report.frames);
    } catch (err) {
      if (!this.closed && err.status !== 401) say("slowest-status", `Slowest frames: ${err.message}`);
    } finally {
      this.busy = false;
    }
  }

  /** The rows, slowest first; a frame's row stays the same element while it is listed. */
  draw(frames) {
    const body = $("slowest").tBodies[0];
    this.frames = new Map(frames.map((f) => [f.seq, f]));
    for (const [seq, tr] of this.rows) {
      if (!this.frames.has(seq)) { tr.remove(); this.rows.delete(seq); }
    }
    frames.forEach((f, i) => {
      const tr = this.rows.get(f.seq) ?? this.row(f.seq);
      const ms = f.blocks.find((b) => b.id === f.slowest_block)?.ms;
      const cells = [timeOf(f.at), fixed(f.total_ms),
        f.slowest_block === null ? "–" : `${f.slowest_block} ${fixed(ms)} ms`,
        f.batch_size === null ? "–" : `${f.batch_size}`, fixed(f.queue_wait_ms)];
      cells.forEach((text, c) => {
        const cell = tr.cells[c + 1];
        if (cell.textContent !== text) cell.textContent = text;
      });
      if (body.rows[i] !== tr) body.insertBefore(tr, body.rows[i] ?? null);
    });
    say("slowest-status", frames.length ? "" : "No frame in the period yet.");
  }

  row(seq) {
    const tr = document.createElement("tr");
    tr.dataset.seq = seq;
    const button = el("button", `${seq}`, "quiet");
    button.type = "button";
    button.setAttribute("aria-label", `Open the trace of frame ${seq}`);
    button.addEventListener("click", () => this.openTrace(this.frames.get(seq)));
    tr.insertCell().append(button);
    for (const cls of ["", "num", "", "num", "num"]) tr.append(el("td", "", cls));
    this.rows.set(seq, tr);
    return tr;
  }

  /** Frame `seq`'s trace, listed or not (the page's address named it), scrolled into
   * view. A 401 leaves it to the token form: the page asks again with the new token
   * until the frame has been shown (`shown`), then no more (a row opened since stays). */
  async openFrame(seq) {
    const trace = `${streamPath(this.id)}/frames/${seq}/trace`;
    const shown = await this.openTrace({ seq, trace });
    if (shown === null) return; // refused, overtaken or closed: nothing of it to show
    this.shown = seq;
    $(shown ? "frame-trace-panel" : "frame-trace-status").scrollIntoView({ block: "start" });
  }

  /** Fetch the frame's trace with the token, draw it and offer it as a file. True once
   * drawn, false when the appliance said why not (shown), null otherwise (a 401, a
   * newer click, the stream closed). */
  async openTrace(frame) {
    if (!frame || !TRACE_PATH.test(frame.trace)) return null;
    const mine = ++this.opening;
    say("frame-trace-status", `Reading the trace of frame ${frame.seq}…`);
    let text;
    try {
      text = await (await api("GET", frame.trace)).text();
    } catch (err) { // 404 once rotated away: the message names the oldest frame held
      if (mine !== this.opening || this.closed) return null;
      $("frame-trace-panel").hidden = true;
      say("frame-trace-status", err.status === 401 ? "" : `Frame ${frame.seq}: ${err.message}`);
      return err.status === 401 ? null : false;
    }
    if (mine !== this.opening || this.closed) return null;
    const doc = JSON.parse(text);
    const drawn = drawTimeline($("frame-trace"), doc, this.id, frame.seq);
    say("frame-trace-seq", `${frame.seq}`);
    forgetLink();
    const link = $("frame-trace-link");
    link.href = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    link.download = `frame-${this.id}-${frame.seq}.json`;
    $("frame-trace-panel").hidden = false;
    say("frame-trace-status", `Frame ${frame.seq}: ${drawn.bars} spans on ${drawn.threads} `
      + `threads over ${fixed(drawn.ms)} ms${drawn.frame ? "" : "; its run is not in the trace"}.`);
    return true;
  }
}

function forgetLink() {
  const link = $("frame-trace-link");
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  link.removeAttribute("href");
}

const fixed = (x, digits = 1) => (typeof x === "number" ? x.toFixed(digits) : "–");

function timeOf(iso) {
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return iso;
  return `${t.toLocaleTimeString([], { hour12: false })}.${String(t.getMilliseconds()).padStart(3, "0")}`;
}

function svg(tag, attrs = {}, text = "") {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

const threadKey = (e) => `${e.pid}:${e.tid}`;

/** Each thread's spans with their nesting level (a span inside another a lane lower). */
function lanes(spans) {
  const threads = new Map();
  for (const e of spans) {
    if (!threads.has(threadKey(e))) threads.set(threadKey(e), []);
    threads.get(threadKey(e)).push(e);
  }
  for (const list of threads.values()) {
    list.sort((a, b) => a.ts - b.ts || b.dur - a.dur);
    const open = []; // end times of the spans around this one
    for (const e of list) {
      while (open.length && open.at(-1) <= e.ts) open.pop();
      e.lane = open.length;
      open.push(e.ts + e.dur);
    }
  }
  return threads;
}

/** The trace as a timeline over its span (otherData.span_us, else its events' extent):
 * a row per thread named by its thread_name, a bar per "X" event, the frame's own
 * workflow.run marked. What was drawn goes on the <svg> as data attributes. */
function drawTimeline(root, doc, stream, seq) {
  const events = Array.isArray(doc.traceEvents) ? doc.traceEvents : [];
  const names = new Map(events.filter((e) => e.ph === "M" && e.name === "thread_name")
    .map((e) => [threadKey(e), `${e.args?.name ?? e.tid}`]));
  const spans = events.filter((e) => e.ph === "X" && Number.isFinite(e.ts) && Number.isFinite(e.dur))
    .map((e) => ({ ...e }));
  let [t0, t1] = Array.isArray(doc.otherData?.span_us) ? doc.otherData.span_us : [];
  if (!(t1 > t0)) {
    t0 = spans.length ? Math.min(...spans.map((e) => e.ts)) : 0;
    t1 = spans.length ? Math.max(...spans.map((e) => e.ts + e.dur)) : 1;
  }
  const scale = (WIDTH - LABEL - 4) / Math.max(1, t1 - t0);
  const x = (ts) => LABEL + (Math.min(Math.max(ts, t0), t1) - t0) * scale;
  const isFrame = (e) => e.name === "workflow.run" && e.args?.seq === seq
    && (e.args?.stream === undefined || e.args.stream === stream);
  const threads = lanes(spans);
  const order = [...names.keys(), ...threads.keys()].filter((k, i, all) => threads.has(k)
    && all.indexOf(k) === i);

  const parts = [
    svg("text", { x: WIDTH - 4, y: 11, "text-anchor": "end", class: "axis" },
      `${fixed((t1 - t0) / 1000)} ms`),
    svg("line", { x1: LABEL, x2: WIDTH - 4, y1: TOP - 2, y2: TOP - 2, class: "axis" }),
  ];
  const drawn = { bars: 0, frame: 0 };
  const windows = []; // the frame's run, shaded over every thread
  let y = TOP;
  for (const key of order) {
    const list = threads.get(key);
    const height = (Math.max(...list.map((e) => e.lane)) + 1) * LANE;
    parts.push(svg("text", { x: 4, y: y + 11, class: "thread" }, names.get(key) ?? key));
    for (const e of list) {
      const mine = isFrame(e);
      const bar = svg("rect", { x: x(e.ts), y: y + e.lane * LANE, height: LANE - 2,
        width: Math.max(1, x(e.ts + e.dur) - x(e.ts)), class: mine ? "bar bar-frame" : "bar" });
      bar.dataset.name = e.name;
      if (mine) {
        bar.dataset.frame = "true";
        bar.dataset.seq = seq;
        windows.push(svg("rect", { x: x(e.ts), y: TOP - 2, class: "frame-window",
          width: Math.max(1, x(e.ts + e.dur) - x(e.ts)) }));
        drawn.frame += 1;
      }
      bar.append(svg("title", {}, `${e.name}: ${fixed(e.dur / 1000, 2)} ms`
        + `${e.args?.seq === undefined ? "" : ` (frame ${e.args.seq})`}`));
      parts.push(bar);
      drawn.bars += 1;
    }
    y += height + GAP;
  }
  for (const w of windows) w.setAttribute("height", Math.max(0, y - TOP));
  root.setAttribute("viewBox", `0 0 ${WIDTH} ${y}`);
  root.replaceChildren(...windows, ...parts);
  Object.assign(root.dataset, { seq, stream, bars: drawn.bars, threads: order.length,
    frame: drawn.frame });
  return { ...drawn, threads: order.length, ms: (t1 - t0) / 1000 };
}
