"""Generate the demo clip: two public-domain photos sliding across a grass background.

    python configs/media/make_demo_clip.py [--out configs/media/demo.mp4]

The astronaut (NASA, public domain) walks left → right and the cameraman (CC0) right → left
across a CC0 grass texture (sources in configs/media/sources/). Figures are ~330 px tall
in a 960×540 frame: at that size the bundled person detector finds them and CenterFace
finds the astronaut's face, and both cross the middle of the frame (a counting line gets
real crossings). H.264, 15 fps, GOP of 1 s, no B-frames: what a camera sends.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import av
import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
WIDTH, HEIGHT, FPS, SECONDS = 960, 540, 15, 16
FIGURE_PX = 330  # figure height; below ~220 px the person detector misses the astronaut


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


def _figure(name: str) -> np.ndarray:
    image = _load(name)
    scale = FIGURE_PX / image.shape[0]
    return cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)


def _paste(canvas: np.ndarray, figure: np.ndarray, x: int, y: int) -> None:
    h, w = figure.shape[:2]
    x0, x1 = max(x, 0), min(x + w, canvas.shape[1])
    if x1 > x0:
        canvas[y : y + h, x0:x1] = figure[:, x0 - x : x1 - x]


def frames() -> list[np.ndarray]:
    bg, astronaut, camera = _background(), _figure("astronaut.png"), _figure("camera.png")
    n = FPS * SECONDS
    out = []
    for i in range(n):
        t = i / (n - 1)
        canvas = bg.copy()
        w = astronaut.shape[1]
        _paste(canvas, astronaut, int(-w + t * (WIDTH + w)), 20)
        _paste(canvas, camera, int(WIDTH - t * (WIDTH + w)), HEIGHT - FIGURE_PX - 20)
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
