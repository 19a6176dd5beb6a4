// One stream, large: its video (annotated by the workflow, or raw with the predictions
// drawn by this page), what the player is doing and why, latency as rolling p50/p95,
// its predictions, counts, per-block latency with the regression watch's verdicts.
// Profiling windows live in profile.js, its shadow (a candidate workflow) in shadow.js,
// its slowest frames and their traces in slowest.js.

import { $, ApiError, apiJson, el, say, stateText, streamPath } from "./api.js";
import { Overlay } from "./overlay.js";
import { Player } from "./player.js";
import { ShadowPanel } from "./shadow.js";
import { SlowestPanel } from "./slowest.js";
import { Rate, Rolling } from "./stats.js";
import { drawWatch, refreshWatch } from "./watch.js";

const LATENCY_EVERY_MS = 2000;
const WATCH_EVERY_MS = 5000; // the watch compares every 30 s by default: no need to hurry
const RENDER_EVERY_MS = 250; // figures and predictions are redrawn at most this often
const MAX_ROWS = 20; // detection rows shown per output

export class StreamView {
  constructor(id) {
    this.id = id;
    this.timers = [];
    this.videoLatency = new Rolling(); // capture -> frame presented, ms
    this.predictionLatency = new Rolling(); // capture -> message received, ms
    this.frameRate = new Rate();
    this.messageRate = new Rate();
    this.latest = null;
    this.drawn = null;
    this.report = null;
    this.slower = new Map();
    this.overlay = new Overlay($("overlay"), $("video"));
    this.shadow = new ShadowPanel(id);
    this.slowest = new SlowestPanel(id);
  }

  open() {
    say("stream-name", this.id);
    document.title = `${this.id} · appliance viewer`;
    this.clear();
    $("latency").tBodies[0].replaceChildren();
    say("latency-summary", "");
    for (const id of ["watch-host", "watch-other"]) {
      $(id).replaceChildren();
      delete $(id).dataset.drawn; // what watch.js drew there: nothing now
    }
    say("watch-status", "");
    this.loadScene();
    this.refreshLatency();
    refreshWatch(this);
    this.shadow.open();
    this.slowest.open();
    this.timers.push(setInterval(() => this.refreshLatency(), LATENCY_EVERY_MS));
    this.timers.push(setInterval(() => refreshWatch(this), WATCH_EVERY_MS));
    this.timers.push(setInterval(() => this.render(), RENDER_EVERY_MS));
    this.play();
  }

  close() {
    this.timers.forEach(clearInterval);
    this.shadow.close();
    this.slowest.close();
    this.player?.stop();
    this.player = null;
    this.overlay.reset();
  }

  /** Every figure and message that belonged to the video that was: gone. */
  clear() {
    for (const r of [this.videoLatency, this.predictionLatency, this.frameRate,
      this.messageRate]) r.clear();
    this.latest = null;
    this.drawn = null;
    this.overlay.reset();
    for (const f of ["video-latency", "predictions-latency", "msg-fps", "video-fps"]) say(f, "–");
    $("counts").replaceChildren();
    $("predictions").replaceChildren(el("p", "No prediction yet.", "empty"));
  }

  /** (Re)start the video with the chosen mode and size. */
  play() {
    this.player?.stop();
    const raw = $("video-mode").value === "raw";
    this.overlay.setEnabled(raw);
    this.player = new Player(this.id, $("video"), {
      raw, predictions: true, frames: true,
      maxWidth: Number($("video-size").value) || null,
      onState: (s) => this.onState(s),
      onPrediction: (m) => this.onPrediction(m),
      onFrameInfo: (m) => this.overlay.addFrame(m),
      onFrame: (now, metadata) => this.onFrame(metadata),
    });
    this.player.start();
  }

  onState({ phase, text }) {
    $("media").dataset.phase = phase;
    if (phase !== "playing") this.clear(); // a frozen frame's figures are not current
    const shown = phase === "playing" ? "Playing." : text;
    say("video-status", shown);
    say("notice", phase === "playing" ? "" : text);
  }

  onPrediction(message) {
    this.latest = message;
    this.messageRate.tick();
    this.predictionLatency.push(Date.now() - message.capture_time * 1000);
    this.overlay.addPrediction(message);
  }

  onFrame(metadata) {
    this.frameRate.tick();
    const info = this.overlay.presented(metadata);
    // When the frame shows: the compositor's expected display time, on the page's clock.
    if (info) this.videoLatency.push(performance.timeOrigin + metadata.expectedDisplayTime
      - info.capture_time * 1000);
  }

  render() {
    const video = $("video");
    say("video-latency", this.videoLatency.summary());
    say("predictions-latency", this.predictionLatency.summary());
    if (this.latest) say("msg-fps", `${this.messageRate.perSecond().toFixed(1)} msg/s`);
    if (video.videoWidth && this.player?.phase === "playing") {
      say("video-fps", `${this.frameRate.perSecond().toFixed(1)} fps · `
        + `${video.videoWidth}×${video.videoHeight}`);
    }
    this.drawPredictions();
  }

  async loadScene() {
    try {
      const scene = await apiJson("GET", `${streamPath(this.id)}/scene`);
      this.overlay.setRegions(scene.regions);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err; // an older appliance: no lines or zones
    }
  }

  // -- predictions, drawn generically: lists of rows as tables, the rest as values -------
  // The frame on screen's own predictions (the video and the table agree), or the
  // newest while no frame is matched (before the frames channel's first entries).
  drawPredictions() {
    const onScreen = this.overlay.onScreen();
    const message = onScreen ?? this.latest;
    if (!message || message === this.drawn) return;
    this.drawn = message;
    const entries = Object.entries(message.outputs);
    drawCounts(entries.filter(([, v]) => isCounts(v)));
    const parts = entries.map(([name, value]) => output(name, value));
    const caption = `frame ${message.seq}${onScreen ? ", on screen" : ", newest"}`;
    $("predictions").replaceChildren(el("p", caption, "note"), ...parts);
  }

  // -- per-block latency -------------------------------------------------------------------
  async refreshLatency() {
    let report;
    try {
      report = await apiJson("GET", `${streamPath(this.id)}/latency`);
    } catch (err) {
      if (err.status !== 401) say("latency-summary", `Latency: ${err.message}`);
      return;
    }
    this.report = report;
    drawWatch(this);
  }

  /** The stream's status, read by the page's stream list: the state line over the video. */
  update(stream) {
    const state = $("stream-state");
    state.textContent = stream.state;
    state.className = `state state-${stream.state}`;
    say("stream-error", stateText(stream));
  }
}

const isCounts = (v) => isRow(v) && ["in", "out", "inside"].some((k) => typeof v[k] === "number");

// One chip per counts output, kept and updated in place (15 times a second).
function drawCounts(counts) {
  const box = $("counts");
  while (box.children.length > counts.length) box.lastChild.remove();
  counts.forEach(([name, value], i) => {
    const chip = box.children[i] ?? box.appendChild(el("span", "", "count"));
    const text = ` ${Object.entries(value).map(([k, v]) => `${k} ${v}`).join(" · ")}`;
    if (chip.firstChild?.textContent === name && chip.lastChild.textContent === text) return;
    chip.replaceChildren(el("strong", name), text);
  });
}

function output(name, value) {
  if (Array.isArray(value) && value.length && value.every(isRow)) return rowsTable(name, value);
  const box = el("div", "", "output");
  const shown = Array.isArray(value) && !value.length ? "none" : format(value);
  box.append(el("strong", `${name}: `), el("span", shown));
  return box;
}

const isRow = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

function rowsTable(name, rows) {
  const table = el("table", "", "rows");
  table.createCaption().textContent = `${name} (${rows.length})`;
  const columns = [...new Set(rows.slice(0, MAX_ROWS).flatMap(Object.keys))];
  const head = table.createTHead().insertRow();
  for (const c of columns) head.append(el("th", c));
  const body = table.createTBody();
  for (const row of rows.slice(0, MAX_ROWS)) {
    const tr = body.insertRow();
    for (const c of columns) tr.insertCell().textContent = format(row[c]);
  }
  return table;
}

function format(value) {
  if (typeof value === "number") return `${Number(value.toFixed(3))}`; // 0.412, 205.9
  if (Array.isArray(value)) return value.map(format).join(", ");
  if (isRow(value)) return Object.entries(value).map(([k, v]) => `${k} ${format(v)}`).join(" · ");
  return value === null || value === undefined ? "–" : `${value}`;
}
