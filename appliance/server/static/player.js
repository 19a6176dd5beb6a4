// One stream's video over WebRTC that keeps itself alive: it retries with backoff on
// every failure (the session closed, ICE failed or lost, the appliance restarting or
// refusing), and says what it is doing and why through onState({phase, text}):
//   connecting · playing (a frame was presented) · waiting (the stream is not running:
//   its state and error) · retrying (why, and when) · unavailable (no WebRTC here) ·
//   stopped.
// The browser offers with every ICE candidate (no trickle); frames are counted with
// requestVideoFrameCallback, which also gives each frame's RTP timestamp.

import { api, apiJson, stateText, streamPath } from "./api.js";

const ICE_GATHER_MS = 5000; // then the offer goes with the candidates it has
const BACKOFF_MS = [500, 1000, 2000]; // then 2 s each: an appliance restarts in seconds
const DISCONNECTED_GRACE_MS = 2500; // ICE "disconnected" often heals by itself
const STALL_MS = 4000; // no frame for this long (or 3 frame intervals): ask why
const CHECK_EVERY_MS = 1000;
const GONE_RETRY_MS = 5000; // a stream that does not exist (yet): look again this often

export class Player {
  /** options: maxWidth, maxFps, raw, predictions, frames (open those data channels),
   *  onState, onPrediction(message), onFrameInfo(message), onFrame(now, metadata). */
  constructor(streamId, video, options = {}) {
    this.streamId = streamId;
    this.video = video;
    this.options = { maxWidth: null, maxFps: null, raw: false, predictions: false,
      frames: false, ...options };
    const noop = () => {};
    this.onState = options.onState ?? noop;
    this.onPrediction = options.onPrediction ?? noop;
    this.onFrameInfo = options.onFrameInfo ?? noop;
    this.onFrame = options.onFrame ?? noop;
    this.active = false;
    this.conn = null;
    this.attempt = 0;
    this.stream = null; // the stream's status, as last read
  }

  start() {
    if (this.active) return;
    this.active = true;
    this.attempt = 0;
    this.played = false; // since start(): "video lost" or "no video yet"
    this.checker = setInterval(() => this.check(), CHECK_EVERY_MS);
    this.connect();
  }

  stop() {
    this.active = false;
    clearInterval(this.checker);
    clearTimeout(this.retryTimer);
    this.teardown();
    this.setState("stopped", "");
  }

  setState(phase, text) {
    this.phase = phase;
    this.onState({ phase, text });
  }

  async connect() {
    clearTimeout(this.retryTimer);
    this.teardown();
    if (!this.active) return;
    const conn = { pc: null, sessionId: null, since: performance.now(), lastFrame: 0,
      playing: false };
    this.conn = conn;
    this.setState("connecting", this.attempt ? "Reconnecting…" : "Connecting…");
    try {
      this.stream = await apiJson("GET", streamPath(this.streamId));
      if (this.conn !== conn) return;
      await this.negotiate(conn);
    } catch (err) {
      if (this.conn === conn) this.failed(conn, err);
    }
  }

  async negotiate(conn) {
    const opts = this.options;
    const pc = new RTCPeerConnection({ iceServers: [] });
    conn.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channels = [];
    if (opts.predictions) channels.push(this.channel(pc, "predictions", this.onPrediction));
    if (opts.frames) channels.push(this.channel(pc, "frames", this.onFrameInfo));
    for (const channel of channels) {
      channel.addEventListener("close", () => this.lost(conn, "the appliance ended the session"));
    }
    pc.addEventListener("track", (event) => {
      if (this.conn !== conn) return;
      this.video.srcObject = event.streams[0] ?? new MediaStream([event.track]);
      this.countFrames(conn);
    });
    pc.addEventListener("connectionstatechange", () => this.onConnection(conn));
    await pc.setLocalDescription(await pc.createOffer());
    await iceGathered(pc);
    const body = { sdp: pc.localDescription.sdp, type: "offer",
      video: opts.raw ? "raw" : "annotated" };
    if (opts.maxWidth) body.max_width = opts.maxWidth;
    if (opts.maxFps) body.max_fps = opts.maxFps;
    const answer = await apiJson("POST", `${streamPath(this.streamId)}/webrtc`, body);
    if (this.conn !== conn) { // stopped or restarted while we waited: end that session too
      closeSession(answer.session_id);
      return;
    }
    conn.sessionId = answer.session_id;
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    this.setState("connecting", "Connected: waiting for the first frame…");
  }

  channel(pc, label, handler) {
    const channel = pc.createDataChannel(label);
    channel.addEventListener("message", (event) => handler(JSON.parse(event.data)));
    return channel;
  }

  countFrames(conn) {
    const video = this.video;
    const frame = (now, metadata) => {
      if (this.conn !== conn) return;
      conn.lastFrame = performance.now();
      if (!conn.playing) {
        conn.playing = true;
        this.played = true;
        this.attempt = 0;
        this.setState("playing", "");
      }
      this.onFrame(now, metadata);
      video.requestVideoFrameCallback(frame);
    };
    video.requestVideoFrameCallback(frame);
  }

  onConnection(conn) {
    const state = conn.pc.connectionState;
    if (state === "failed" || state === "closed") {
      this.lost(conn, `the connection ${state}`);
    } else if (state === "disconnected") {
      clearTimeout(conn.grace);
      conn.grace = setTimeout(() => {
        if (conn.pc.connectionState === "disconnected") this.lost(conn, "the connection was lost");
      }, DISCONNECTED_GRACE_MS);
    }
  }

  // Once a second: no frame for a while? The stream may not be running (then say so and
  // wait), the appliance may be gone, or the session dead (then start again).
  async check() {
    const conn = this.conn;
    if (!conn || !conn.sessionId || this.checking) return;
    const fps = this.stream?.fps || 0;
    const stall = Math.max(STALL_MS, fps > 0 ? 3000 / fps : 0);
    if (performance.now() - Math.max(conn.lastFrame, conn.since) < stall) return;
    this.checking = true;
    try {
      const stream = await apiJson("GET", streamPath(this.streamId));
      if (this.conn !== conn) return;
      this.stream = stream;
      if (stream.state !== "running") {
        conn.since = performance.now(); // the session stays: frames come back with the stream
        conn.playing = false;
        this.setState("waiting", stateText(stream));
        return;
      }
      this.lost(conn, `no video for ${Math.round(stall / 1000)} s while the stream runs`);
    } catch (err) {
      if (this.conn === conn) this.failed(conn, err);
    } finally {
      this.checking = false;
    }
  }

  lost(conn, why) {
    if (this.conn !== conn || !this.active) return;
    this.retry(why);
  }

  failed(conn, err) {
    if (err.status === 401) { // the page asks for the token; start() again once given
      this.teardown();
      this.setState("retrying", "The appliance needs a valid token.");
      return;
    }
    if (err.status === 405 || (err.status === 404 && err.message.startsWith("no route"))) {
      this.teardown(); // an appliance without WebRTC: retrying would not change that
      this.setState("unavailable", "This appliance does not serve WebRTC video.");
      return;
    }
    if (err.status === 404) {
      this.retry(`no stream named ${this.streamId} (yet)`, GONE_RETRY_MS);
      return;
    }
    const why = err.status === 429 ? `no free video session (${err.message})`
      : err.status === 0 ? err.message : `${err.message} (${err.status || "WebRTC"})`;
    this.retry(why, err.retryAfterS ? err.retryAfterS * 1000 : null);
  }

  retry(why, delayMs = null) {
    this.teardown();
    const backoff = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    const delay = delayMs ?? backoff * (0.8 + 0.4 * Math.random()); // jitter: many viewers
    this.attempt += 1;
    const lead = this.played ? "Video lost" : "No video yet";
    this.setState("retrying", `${lead}: ${why}. Retrying in ${(delay / 1000).toFixed(1)} s.`);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  teardown() {
    const conn = this.conn;
    this.conn = null;
    if (!conn) return;
    clearTimeout(conn.grace);
    conn.pc?.close();
    if (conn.sessionId) closeSession(conn.sessionId);
    this.video.srcObject = null; // no frozen frame left on screen
  }
}

function closeSession(sessionId) {
  api("DELETE", `/v1/webrtc/${encodeURIComponent(sessionId)}`, undefined, { keepalive: true })
    .catch(() => {});
}

function iceGathered(pc) {
  return new Promise((resolve) => {
    const check = () => { if (pc.iceGatheringState === "complete") resolve(); };
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(resolve, ICE_GATHER_MS);
    check();
  });
}
