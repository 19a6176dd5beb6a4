"""Generate the demo clip: two public-domain photos sliding across a grass background.

    python configs/media/make_demo_clip.py [--out configs/media/demo.mp4]

The astronaut (NASA, public domain) crosses left → right in the first half of the clip,
then the cameraman (CC0) right → left in the second half, over a CC0 grass texture
(sources in configs/media/sources/). Sizes are chosen so that the bundled person detector
finds each on most frames (the astronaut's portrait needs ~520 px; at 330-480 px it scores
below 0.5 on many frames) and CenterFace finds both faces. Each crosses the middle once, so
a counting line there counts one in and one out per loop. H.264, 15 fps, GOP of 1 s, no
B-frames: what a camera sends.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import av
import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
WIDTH, HEIGHT, FPS, SECONDS = 960, 540, 15, 16
ASTRONAUT_PX, CAMERA_PX = 520, 330  # figure heights in pixels, see above


def _load(name: str) -> np.ndarray:
    image = cv2.imread(str(HERE / "sources" / name), cv2.IMREAD_COLOR)
    if image is None:
        raise SystemExit(f"missing source image: {HERE / 'sources' / name}")
    return image


def _background() -> np.ndarray:
    grass = _load("grass.png")
    tiled = np.tile(grass, (2, 2, 1))[:HEIGHT, :WIDTH]
    # Tint the grey texture green so the scene reads as grass.
    tint = np.array([0.55, 1.0, 0.6], dtype=np.float32)
    return np.clip(tiled.astype(np.float32) * tint, 0, 255).astype(np.uint8)


def _figure(name: str, height: int) -> np.ndarray:
    image = _load(name)
    scale = height / image.shape[0]
    return cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)


def _paste(canvas: np.ndarray, figure: np.ndarray, x: int, y: int) -> None:
    h, w = figure.shape[:2]
    x0, x1 = max(x, 0), min(x + w, canvas.shape[1])
    if x1 > x0:
        canvas[y : y + h, x0:x1] = figure[:, x0 - x : x1 - x]


def frames() -> list[np.ndarray]:
    bg = _background()
    astronaut = _figure("astronaut.png", ASTRONAUT_PX)
    camera = _figure("camera.png", CAMERA_PX)
    half = FPS * SECONDS // 2
    out = []
    for i in range(2 * half):
        t = (i % half) / (half - 1)  # 0 -> 1 across each half
        canvas = bg.copy()
        if i < half:
            w = astronaut.shape[1]
            _paste(canvas, astronaut, int(-w + t * (WIDTH + w)), (HEIGHT - ASTRONAUT_PX) // 2)
        else:
            w = camera.shape[1]
            _paste(canvas, camera, int(WIDTH - t * (WIDTH + w)), HEIGHT - CAMERA_PX - 30)
        out.append(canvas)
    return out


def write(path: Path) -> None:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"crf": "26", "preset": "slow", "g": str(FPS), "bf": "0"}
        for image in frames():
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "demo.mp4")
    write(parser.parse_args().out)
