// Injected by bench/viewer.py before the viewer page loads (add_init_script; the page's
// Content-Security-Policy forbids eval, not init scripts). It records, in window.__bench:
//   predictions: [arrival wall ms, seq, capture_time s] for each `predictions` message,
//   frames: [arrival wall ms, rtp_timestamp, seq, capture_time s] for each `frames` one,
//   presented: [stamp, expectedDisplayTime wall ms, presentationTime wall ms,
//               receiveTime wall ms or null, rtpTimestamp, processingDuration ms or null]
//     for each frame #video presents, its clock-camera stamp read from its pixels
//     (null when unreadable), as tests/support/clock_camera.py's read_stamp reads it;
//   overlaid: [rtp, had predictions] for each frame the page's own overlay matched to its
//     result (its "overlay" event), to compare with what was presented.
// Wall ms = performance.timeOrigin + a performance-clock time (what the page itself uses).
// LAYOUT ({blocks, checkBits, salt, threshold, margin, watch}) is defined by the bench,
// from tests/support/clock_camera_server.py, in a line put before this file; `watch`
// false: only the data channels are recorded (the grid's CPU is measured without it).
/* global LAYOUT */
(() => {
  const rec = { predictions: [], frames: [], presented: [], overlaid: [] };
  window.__bench = rec;
  const wall = (t) => performance.timeOrigin + t;

  // The page opens its data channels itself: listen to them beside it.
  const create = RTCPeerConnection.prototype.createDataChannel;
  RTCPeerConnection.prototype.createDataChannel = function (label, ...rest) {
    const channel = create.call(this, label, ...rest);
    if (label === "predictions" || label === "frames") {
      channel.addEventListener("message", (event) => {
        const at = wall(performance.now());
        const m = JSON.parse(event.data);
        if (label === "predictions") rec.predictions.push([at, m.seq, m.capture_time]);
        else rec.frames.push([at, m.rtp_timestamp, m.seq, m.capture_time]);
      });
    }
    return channel;
  };

  const bandRows = (h) => Math.max(16, Math.floor(Math.floor(h / 10) / 16) * 16);
  const blockPx = (w) => Math.floor(Math.floor(w / LAYOUT.blocks) / 8) * 8;
  const checkNibble = (s) => (s ^ (s >> 4) ^ (s >> 8) ^ (s >> 12) ^ LAYOUT.salt) & 0xf;

  let canvas = null;
  let ctx = null;

  /** The stamp in the band on top of the frame being presented, or null. */
  function readStamp(video) {
    const w = video.videoWidth;
    const h = video.videoHeight;
    const rows = bandRows(h);
    const block = blockPx(w);
    if (!block) return null;
    const width = LAYOUT.blocks * block;
    if (!canvas || canvas.width !== width || canvas.height !== rows) {
      canvas = new OffscreenCanvas(width, rows);
      ctx = canvas.getContext("2d", { willReadFrequently: true });
    }
    ctx.drawImage(video, 0, 0, width, rows, 0, 0, width, rows);
    const data = ctx.getImageData(0, 0, width, rows).data;
    let word = 0;
    for (let b = 0; b < LAYOUT.blocks; b += 1) {
      let sum = 0;
      let n = 0;
      // The central half of each block, as read_stamp does (H.264 blurs the edges).
      for (let y = Math.floor(rows / 4); y < Math.floor((3 * rows) / 4); y += 1) {
        const x0 = b * block + Math.floor(block / 4);
        const x1 = b * block + Math.floor((3 * block) / 4);
        for (let x = x0; x < x1; x += 1) {
          const i = (y * width + x) * 4;
          sum += data[i] + data[i + 1] + data[i + 2];
          n += 3;
        }
      }
      const level = sum / n;
      if (Math.abs(level - LAYOUT.threshold) < LAYOUT.margin) return null;
      word = (word << 1) | (level > LAYOUT.threshold ? 1 : 0);
    }
    const stamp = word >> LAYOUT.checkBits;
    return (word & ((1 << LAYOUT.checkBits) - 1)) === checkNibble(stamp) ? stamp : null;
  }

  function watch(video) {
    const frame = (_now, m) => {
      const stamp = video.videoWidth ? readStamp(video) : null;
      rec.presented.push([stamp, wall(m.expectedDisplayTime), wall(m.presentationTime),
        m.receiveTime === undefined ? null : wall(m.receiveTime), m.rtpTimestamp ?? null,
        m.processingDuration === undefined ? null : m.processingDuration * 1000]);
      video.requestVideoFrameCallback(frame);
    };
    video.requestVideoFrameCallback(frame);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const video = document.getElementById("video");
    if (video && LAYOUT.watch) watch(video);
    document.getElementById("overlay")?.addEventListener("overlay", (event) => {
      rec.overlaid.push([event.detail.rtp, event.detail.boxes === null ? 0 : 1]);
    });
  });
})();
