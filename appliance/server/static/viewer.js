// The appliance's web viewer: streams, one stream over WebRTC with its predictions,
// its per-block latency with the regression watch's verdicts, profiling windows. Only the
// /v1 API, with the user's token.
// No build step, no dependency; text is always set with textContent (ids are data).

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "appliance.token";
const STREAMS_EVERY_MS = 3000;
const LATENCY_EVERY_MS = 2000;
const WATCH_EVERY_MS = 5000; // the watch compares every 30 s by default: no need to hurry
const ICE_GATHER_MS = 5000; // then the offer goes with the candidates it has
const RENDER_EVERY_MS = 250; // predictions are redrawn at most this often
const MAX_ROWS = 20; // detection rows shown per output

let token = sessionStorage.getItem(TOKEN_KEY);
let view = null; // the open stream: {id, pc, sessionId, timers, counters}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// -- the API ---------------------------------------------------------------------
async function api(method, path, body, extra = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const init = { method, headers, cache: "no-store", ...extra };
  if (body !== undefined) init.body = JSON.stringify(body);
  const resp = await fetch(path, init);
  if (resp.status === 401) {
    askToken(token ? "The appliance refused this token (401): enter it again."
      : "This appliance needs its API token.");
    throw new ApiError(401, "unauthorized");
  }
  if (!resp.ok) {
    const detail = await resp.json().catch(() => null);
    throw new ApiError(resp.status, detail?.error?.message ?? resp.statusText);
  }
  return resp;
}

const apiJson = async (method, path, body) => (await api(method, path, body)).json();
const say = (el, text) => { $(el).textContent = text; };

// -- the token -----------------------------------------------------------------------
function askToken(reason) {
  say("token-reason", reason);
  $("token-form").hidden = false;
  $("token").focus();
}

function useToken(event) {
  event.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").value = "";
  $("token-form").hidden = true;
  say("status", "Token saved for this tab.");
  refreshStreams();
  if (view) openStream(view.id);
}

// -- the stream list -------------------------------------------------------------------
async function refreshStreams() {
  let streams;
  try {
    streams = (await apiJson("GET", "/v1/streams")).streams;
  } catch (err) {
    if (err.status !== 401) say("status", `Streams: ${err.message}`);
    return;
  }
  $("streams").replaceChildren(...streams.map(streamItem));
  if (!streams.length) $("streams").append(el("li", "No stream runs.", "empty"));
}

function streamItem(s) {
  const link = el("a", s.id);
  link.href = `/streams/${encodeURIComponent(s.id)}`;
  link.addEventListener("click", (event) => {
    event.preventDefault();
    history.pushState(null, "", link.href);
    openStream(s.id);
  });
  if (view?.id === s.id) link.setAttribute("aria-current", "page");
  const state = el("span", s.state, `state state-${s.state}`);
  const figures = el("span", `${s.fps.toFixed(1)} fps · ${s.workflow}`, "note");
  const item = el("li", "", "stream");
  item.append(link, " ", state, " ", figures);
  if (s.last_error) item.title = s.last_error;
  return item;
}

// -- one stream --------------------------------------------------------------------------
function openStream(id) {
  closeStream();
  view = { id, pc: null, sessionId: null, timers: [], latest: null, drawn: null,
    messages: 0, frames: 0, since: performance.now(), report: null, slower: new Map() };
  $("viewer").hidden = false;
  say("stream-name", id);
  document.title = `${id} · appliance viewer`;
  for (const f of ["e2e", "msg-fps", "video-fps"]) say(f, "–");
  $("predictions").replaceChildren(el("p", "No prediction yet.", "empty"));
  $("latency").tBodies[0].replaceChildren();
  say("latency-summary", "");
  for (const id of ["watch-host", "watch-other"]) $(id).replaceChildren();
  say("watch-status", "");
  refreshLatency();
  refreshWatch();
  view.timers.push(setInterval(refreshLatency, LATENCY_EVERY_MS));
  view.timers.push(setInterval(refreshWatch, WATCH_EVERY_MS));
  view.timers.push(setInterval(tick, 1000));
  view.timers.push(setInterval(drawPredictions, RENDER_EVERY_MS));
  const v = view;
  play(v).catch((err) => {
    if (view !== v) return; // closed meanwhile: nothing to say
    if (err.status === 404 || err.status === 405) {
      say("video-status", "This appliance does not serve WebRTC video for this stream.");
    } else if (err.status !== 401) {
      say("video-status", `Video: ${err.message}`);
    }
  });
  refreshStreams();
}

function closeStream() {
  if (!view) return;
  view.timers.forEach(clearInterval);
  view.pc?.close();
  if (view.sessionId) {
    api("DELETE", `/v1/webrtc/${encodeURIComponent(view.sessionId)}`, undefined,
      { keepalive: true }).catch(() => {});
  }
  $("video").srcObject = null;
  view = null;
}

function hideViewer() {
  closeStream();
  $("viewer").hidden = true;
  document.title = "appliance viewer";
  say("video-status", "");
  refreshStreams();
}

function stop() {
  history.pushState(null, "", "/");
  hideViewer();
}

// -- WebRTC: the browser offers, with every ICE candidate (no trickle) ----------------------
async function play(v) {
  say("video-status", "Connecting…");
  const pc = new RTCPeerConnection({ iceServers: [] });
  v.pc = pc;
  pc.addTransceiver("video", { direction: "recvonly" });
  const channel = pc.createDataChannel("predictions");
  channel.addEventListener("message", (event) => onPrediction(v, event.data));
  pc.addEventListener("track", (event) => {
    $("video").srcObject = event.streams[0] ?? new MediaStream([event.track]);
    countVideoFrames(v);
  });
  pc.addEventListener("connectionstatechange", () => {
    if (view === v) say("video-status", `Video ${pc.connectionState}.`);
  });
  await pc.setLocalDescription(await pc.createOffer());
  await iceGathered(pc);
  const offer = { sdp: pc.localDescription.sdp, type: "offer" };
  const answer = await apiJson("POST", `/v1/streams/${encodeURIComponent(v.id)}/webrtc`, offer);
  if (view !== v) { // closed while we waited: end the server's session too
    api("DELETE", `/v1/webrtc/${encodeURIComponent(answer.session_id)}`).catch(() => {});
    return;
  }
  v.sessionId = answer.session_id;
  await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
}

function iceGathered(pc) {
  return new Promise((resolve) => {
    const check = () => { if (pc.iceGatheringState === "complete") resolve(); };
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(resolve, ICE_GATHER_MS);
    check();
  });
}

function countVideoFrames(v) {
  const video = $("video");
  if (!("requestVideoFrameCallback" in video)) return; // tick() reads playback quality
  const frame = () => {
    if (view !== v) return;
    v.frames += 1;
    video.requestVideoFrameCallback(frame);
  };
  video.requestVideoFrameCallback(frame);
}

function onPrediction(v, data) {
  const message = JSON.parse(data);
  v.latest = message;
  v.messages += 1;
  v.latencyMs = Date.now() - message.capture_time * 1000;
}

// Once a second: the rates since the last tick, and the newest end-to-end latency.
function tick() {
  const v = view;
  const now = performance.now();
  const seconds = (now - v.since) / 1000;
  const video = $("video");
  if (!("requestVideoFrameCallback" in video) && video.getVideoPlaybackQuality) {
    const total = video.getVideoPlaybackQuality().totalVideoFrames;
    v.frames += total - (v.totalFrames ?? total);
    v.totalFrames = total;
  }
  if (v.latest) say("msg-fps", `${(v.messages / seconds).toFixed(1)} msg/s`);
  if (v.latencyMs !== undefined) say("e2e", `${Math.round(v.latencyMs)} ms`);
  if (video.videoWidth) {
    say("video-fps", `${(v.frames / seconds).toFixed(1)} fps · ${video.videoWidth}×${video.videoHeight}`);
  }
  v.messages = 0;
  v.frames = 0;
  v.since = now;
}

// -- predictions, drawn generically: lists of rows as tables, the rest as values -------------
function drawPredictions() {
  const message = view?.latest;
  if (!message || message === view.drawn) return;
  view.drawn = message;
  const parts = Object.entries(message.outputs).map(([name, value]) => output(name, value));
  $("predictions").replaceChildren(el("p", `frame ${message.seq}`, "note"), ...parts);
}

function output(name, value) {
  if (Array.isArray(value) && value.every(isRow)) return rowsTable(name, value);
  const box = el("div", "", "output");
  box.append(el("strong", `${name}: `), el("span", format(value)));
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

// -- per-block latency ---------------------------------------------------------------------
async function refreshLatency() {
  const v = view;
  let report;
  try {
    report = await apiJson("GET", `/v1/streams/${encodeURIComponent(v.id)}/latency`);
  } catch (err) {
    if (err.status !== 401 && view === v) say("latency-summary", `Latency: ${err.message}`);
    return;
  }
  if (view !== v) return;
  v.report = report;
  drawLatency(v);
}

function drawLatency(v) {
  const report = v.report;
  if (!report) return;
  const ms = (x) => (x === null ? "–" : x.toFixed(2));
  const rows = [{ id: "workflow", type: "(whole run)", whole: true, ...report.workflow },
    ...report.blocks];
  $("latency").tBodies[0].replaceChildren(...rows.map((b) => {
    const tr = document.createElement("tr");
    for (const [text, cls] of [[b.id, ""], [b.type, ""], [ms(b.p50_ms), "num"], [ms(b.p99_ms), "num"]]) {
      tr.append(el("td", text, cls));
    }
    const regression = b.whole ? undefined : v.slower.get(b.id);
    if (regression) tr.cells[0].append(" ", ...regressionBadge(regression));
    return tr;
  }));
  const fps = report.fps === null ? "–" : report.fps.toFixed(1);
  say("latency-summary", `Last ${report.frames} frames, ${fps} fps.`);
}

// -- the regression watch: blocks slower than their baseline, and the host ------------------
async function refreshWatch() {
  const v = view;
  let stream, report;
  try {
    [stream, report] = await Promise.all([
      apiJson("GET", `/v1/streams/${encodeURIComponent(v.id)}`),
      apiJson("GET", "/v1/regressions").catch((err) => { // 404: an appliance without a watch
        if (err.status === 404) return { host: null };
        throw err;
      }),
    ]);
  } catch (err) {
    if (err.status !== 401 && view === v) say("watch-status", `Regression watch: ${err.message}`);
    return;
  }
  if (view !== v) return;
  const regressions = stream.watch?.regressions ?? [];
  v.slower = new Map(regressions.filter((r) => r.kind === "block").map((r) => [r.block, r]));
  drawLatency(v);
  // The stream's others (its frame age): a line each. The host: one line, for every stream.
  const others = regressions.filter((r) => r.kind !== "block");
  $("watch-other").replaceChildren(...others.map((r) => watchLine(
    `${r.name} is ${ratio(r)} slower than its baseline since ${r.started_at}.`, r)));
  const host = report.host;
  $("watch-host").replaceChildren(...(host ? [watchLine(`The host is ${ratio(host)} slower as a `
    + `whole since ${host.started_at} (probe ${ratio(host, "probe_ratio")}, rows `
    + `${ratio(host, "common_ratio")}): the machine, not a block. Blocks are judged on what `
    + "it does not explain.", host)] : []));
}

const ratio = (r, field = "ratio") => (r[field] == null ? "×?" : `×${r[field].toFixed(2)}`);

function regressionBadge(r) {
  const badge = el("span", `slower ${ratio(r)}`, "badge badge-slower");
  const change = r.change ? `, after: ${r.change.summary} (${r.change.at})` : "";
  badge.title = `p50 ${r.baseline_p50_ms.toFixed(2)} ms in the baseline, ${r.current_p50_ms.toFixed(2)} ms `
    + `now (p99 ${r.baseline_p99_ms.toFixed(2)} → ${r.current_p99_ms.toFixed(2)} ms); `
    + `since ${r.started_at}${change}`;
  const link = evidenceLink(r);
  return link ? [badge, " ", link] : [badge];
}

function watchLine(text, r) {
  const line = el("p", text, "watch-line");
  const link = evidenceLink(r);
  if (link) line.append(" ", link);
  return line;
}

// The trace the watch recorded when the regression started: fetched with the token (a plain
// link would carry none), then saved. Only our own API's trace paths are followed.
function evidenceLink(r) {
  const path = r.evidence?.trace;
  if (typeof path !== "string" || !/^\/v1\/profiling\/[\w-]+\/trace$/.test(path)) return null;
  const link = el("a", "evidence trace", "evidence");
  link.href = path;
  link.addEventListener("click", (event) => {
    event.preventDefault();
    saveTrace(path, `appliance-regression-${r.id}.json`);
  });
  return link;
}

async function saveTrace(path, name) {
  let blob;
  try {
    blob = await (await api("GET", path)).blob();
  } catch (err) { // 409 while the window still records
    if (err.status !== 401) say("watch-status", `Evidence trace: ${err.message}`);
    return;
  }
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
  say("watch-status", `Saved ${name}: open it at ui.perfetto.dev (Open trace file).`);
}

// -- profiling windows -----------------------------------------------------------------------
async function profile(event) {
  event.preventDefault();
  const v = view;
  const body = { duration_s: Number($("profile-duration").value), streams: [v.id],
    ort_operators: $("profile-ort").checked };
  $("profile-start").disabled = true;
  $("profile-result").hidden = true;
  try {
    await followWindow(await apiJson("POST", "/v1/profiling", body));
  } catch (err) {
    if (err.status !== 401) say("profile-status", `Profiling: ${err.message}`);
  } finally {
    $("profile-start").disabled = false;
    $("profile-progress").hidden = true;
  }
}

async function followWindow(win) {
  const started = performance.now();
  const bar = $("profile-progress");
  bar.hidden = false;
  let status = win;
  say("profile-status", `Profiling window ${win.id} runs for ${win.duration_s} s…`);
  while (status.state === "running") {
    bar.value = Math.min(1, (performance.now() - started) / 1000 / win.duration_s);
    await new Promise((r) => setTimeout(r, 250));
    status = await apiJson("GET", `/v1/profiling/${encodeURIComponent(win.id)}`);
  }
  if (status.state === "failed") throw new ApiError(0, status.error ?? "failed");
  const blob = await (await api("GET", status.trace)).blob();
  const link = $("profile-link");
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(blob);
  link.download = `appliance-${win.id}.json`;
  $("profile-result").hidden = false;
  say("profile-status", `Window ${win.id} done: its trace is ready.`);
}

// -- start -------------------------------------------------------------------------------------
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function route() {
  const match = location.pathname.match(/^\/streams\/([^/]+)$/);
  if (match) openStream(decodeURIComponent(match[1]));
  else if (view) hideViewer();
}

$("token-form").addEventListener("submit", useToken);
$("change-token").addEventListener("click", () => askToken("Enter the appliance's API token."));
$("stop").addEventListener("click", stop);
$("profile-form").addEventListener("submit", profile);
window.addEventListener("popstate", route);
window.addEventListener("pagehide", closeStream);
refreshStreams();
setInterval(refreshStreams, STREAMS_EVERY_MS);
route();
