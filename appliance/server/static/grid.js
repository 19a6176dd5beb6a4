// Every stream as a live tile: WebRTC at 320 px and 5 fps (the appliance scales and
// encodes each tile once per viewer; MJPEG would re-encode every frame as JPEG on the
// same cores and gives no frame-accurate clock, snapshots would poll), with its state,
// fps and health. A tile plays only while it is on screen (an IntersectionObserver stops
// its session when it scrolls away or the grid is hidden), so the grid holds at most as
// many sessions as tiles in view; past webrtc.max_sessions a tile says so and retries
// when the appliance says it may (Retry-After).

import { el, stateText } from "./api.js";
import { Player } from "./player.js";

export const TILE_WIDTH = 320; // px: the size asked for (max_width)
export const TILE_FPS = 5;

export class Grid {
  constructor(container, onOpen) {
    this.container = container;
    this.onOpen = onOpen; // (stream id) -> open it large
    this.tiles = new Map(); // id -> {node, player, ...}
    this.shown = true;
    this.observer = new IntersectionObserver((entries) => {
      for (const entry of entries) this.visible(entry.target.dataset.stream, entry.isIntersecting);
    }, { threshold: 0.05 });
  }

  /** The stream list changed or was read again. */
  update(streams) {
    const ids = new Set(streams.map((s) => s.id));
    for (const [id, tile] of this.tiles) if (!ids.has(id)) this.remove(id, tile);
    for (const stream of streams) {
      const tile = this.tiles.get(stream.id) ?? this.add(stream.id);
      describe(tile, stream);
    }
    this.container.querySelector(".empty")?.remove();
    if (!streams.length) this.container.append(el("p", "No stream runs.", "empty"));
  }

  add(id) {
    const video = el("video");
    Object.assign(video, { muted: true, autoplay: true, playsInline: true });
    const notice = el("p", "", "tile-notice");
    const link = el("a", "", "tile-media");
    link.href = `/streams/${encodeURIComponent(id)}`;
    link.setAttribute("aria-label", `Open ${id}`);
    link.append(video, notice);
    link.addEventListener("click", (event) => { event.preventDefault(); this.onOpen(id); });
    const name = el("strong", id, "tile-name");
    const state = el("span", "", "state");
    const fps = el("span", "", "tile-fps note");
    const badge = el("span", "", "badge");
    const info = el("div", "", "tile-info");
    info.append(name, " ", state, " ", fps, " ", badge);
    const node = el("article", "", "tile");
    node.dataset.stream = id;
    node.append(link, info);
    this.container.append(node);
    const tile = { node, video, notice, state, fps, badge, stream: null, player: null };
    tile.player = new Player(id, video, { maxWidth: TILE_WIDTH, maxFps: TILE_FPS,
      onState: (s) => this.playerState(tile, s) });
    this.tiles.set(id, tile);
    this.observer.observe(node);
    return tile;
  }

  remove(id, tile) {
    this.observer.unobserve(tile.node);
    tile.player.stop();
    tile.node.remove();
    this.tiles.delete(id);
  }

  visible(id, yes) {
    const tile = this.tiles.get(id);
    if (!tile) return;
    if (yes && this.shown) tile.player.start();
    else tile.player.stop();
  }

  playerState(tile, { phase, text }) {
    tile.node.dataset.phase = phase;
    const stream = tile.stream;
    const notRunning = stream && stream.state !== "running" ? stateText(stream) : "";
    tile.notice.textContent = phase === "playing" || phase === "stopped" ? notRunning
      : text || notRunning;
  }

  show(yes) {
    this.shown = yes;
    this.container.hidden = !yes;
    if (!yes) for (const tile of this.tiles.values()) tile.player.stop();
    // Shown again: the observer reports the tiles in view, which start.
  }

  stopAll() { for (const tile of this.tiles.values()) tile.player.stop(); }
}

function describe(tile, stream) {
  tile.stream = stream;
  tile.state.textContent = stream.state;
  tile.state.className = `state state-${stream.state}`;
  tile.fps.textContent = `${stream.fps.toFixed(1)} fps`;
  const slower = stream.watch?.regressions ?? [];
  const worst = Math.max(0, ...slower.map((r) => r.ratio ?? 0));
  if (slower.length) {
    tile.badge.textContent = `slower ×${worst.toFixed(2)}`;
    tile.badge.className = "badge badge-slower";
    tile.badge.title = slower.map((r) => `${r.name}: ×${(r.ratio ?? 0).toFixed(2)}`).join("\n");
  } else {
    tile.badge.textContent = stream.state === "running" ? "healthy" : "";
    tile.badge.className = stream.state === "running" ? "badge badge-ok" : "badge";
    tile.badge.title = "";
  }
  if (tile.player.phase !== "playing" || stream.state !== "running") {
    tile.notice.textContent = stateText(stream) || tile.notice.textContent;
  }
}
