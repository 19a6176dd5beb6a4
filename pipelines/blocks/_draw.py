"""Colours and text drawing shared by `annotate` and `blur` (OpenCV only).

Colours are written in configs as "#RRGGBB" (what every colour picker shows) and turned
into OpenCV's BGR tuples once, at build time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field

from pipelines.types import Image

HexColor = Annotated[str, Field(pattern=r"^#[0-9A-Fa-f]{6}$")]
BGR = tuple[int, int, int]
Rect = tuple[int, int, int, int]  # x1, y1, x2, y2 px, x2 and y2 exclusive

# Tableau 10: ten colours that stay distinct on video and for most colour-blind viewers.
# Kept as written (fmt: skip): two rows of five read as the palette's own layout.
PALETTE_HEX = (
    "#4E79A7", "#F28E2B", "#E15759", "#76B7B2", "#59A14F",
    "#EDC948", "#B07AA1", "#FF9DA7", "#9C755F", "#BAB0AC",
)  # fmt: skip
FONT = cv2.FONT_HERSHEY_SIMPLEX
WHITE: BGR = (255, 255, 255)
BLACK: BGR = (0, 0, 0)
LABEL_GAP = 2  # px between a label moved out of the way and what it makes way for


def bgr(hex_color: str) -> BGR:
    """ "#RRGGBB" -> (B, G, R) ints, the order OpenCV draws in."""
    value = int(hex_color[1:], 16)
    return (value & 0xFF, (value >> 8) & 0xFF, (value >> 16) & 0xFF)


def contrast(color: BGR) -> BGR:
    """Black or white, whichever reads better on `color` (ITU-R BT.601 luma)."""
    b, g, r = color
    return BLACK if 0.299 * r + 0.587 * g + 0.114 * b > 150 else WHITE


PALETTE: tuple[BGR, ...] = tuple(bgr(h) for h in PALETTE_HEX)


def palette_index(ids: npt.NDArray[np.int64]) -> list[int]:
    """Palette slots for class or track ids (negative ids wrap too)."""
    slots: list[int] = (ids % len(PALETTE)).tolist()
    return slots


def label(
    image: Image,
    text: str,
    origin: tuple[int, int],
    color: BGR,
    scale: float,
    thickness: int = 1,
) -> None:
    """`text` on a filled box of `color` whose bottom-left corner is `origin`, moved
    down inside the image when it would stick out of the top (boxes at the top edge)."""
    (tw, th), base = cv2.getTextSize(text, FONT, scale, thickness)
    x, y = origin
    y = max(y, th + base)
    cv2.rectangle(image, (x, y - th - base), (x + tw, y), color, cv2.FILLED)
    cv2.putText(image, text, (x, y - base), FONT, scale, contrast(color), thickness, cv2.LINE_AA)


def label_size(text: str, scale: float, thickness: int = 1) -> tuple[int, int]:
    """The (width, height) in px of `label`'s filled box for `text`."""
    (tw, th), base = cv2.getTextSize(text, FONT, scale, thickness)
    return tw, th + base


def fit_label(
    top_left: tuple[int, int], size: tuple[int, int], frame: tuple[int, int], avoid: Rect | None
) -> tuple[int, int]:
    """Where a label of `size` (w, h) that wants its top-left corner at `top_left` goes:
    inside a `frame` of (width, height), and below `avoid` (else beside it, when below
    would leave the frame) where it would overlap it. Returns `label`'s origin (the
    box's bottom-left corner)."""
    (w, h), (fw, fh) = size, frame
    x = min(max(top_left[0], 0), max(fw - w, 0))
    y = min(max(top_left[1], 0), max(fh - h, 0))
    if avoid is not None and _overlap((x, y, x + w, y + h), avoid):
        if avoid[3] + LABEL_GAP + h <= fh:
            y = avoid[3] + LABEL_GAP
        else:
            x = min(avoid[2] + LABEL_GAP, max(fw - w, 0))
    return x, y + h


def _overlap(a: Rect, b: Rect) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def text_lines_rect(lines: Sequence[str], origin: tuple[int, int], scale: float) -> Rect | None:
    """The area `text_lines` covers (None for no lines): its boxes' bounding rectangle."""
    if not lines:
        return None
    sizes = [label_size(line, scale) for line in lines]
    x, y = origin
    return x, y, x + max(w for w, _ in sizes), y + sum(h for _, h in sizes)


def text_lines(image: Image, lines: Sequence[str], origin: tuple[int, int], scale: float) -> None:
    """Lines of white text on black boxes, top to bottom from `origin` (top-left)."""
    x, y = origin
    for line in lines:
        (_, th), base = cv2.getTextSize(line, FONT, scale, 1)
        y += th + base
        label(image, line, (x, y), BLACK, scale)
