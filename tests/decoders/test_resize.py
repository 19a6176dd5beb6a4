"""Letterbox / resize geometry and the Transform that maps model pixels back to the frame."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pipelines.decoders.base import Transform
from pipelines.decoders.resize import (
    PAD_GREY,
    Letterbox,
    Resize,
    boxes_to_frame,
    planar_rgb,
    points_to_frame,
)


def frame(w: int, h: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    ("w", "h", "transform", "border"),
    [
        # 16:9 into a square: scale 0.5, 140 grey rows above and below
        (1280, 720, Transform(0.5, 0.5, 0, 140, 1280, 720), ((0, 139), (639, 500))),
        # portrait: pillarboxed left and right
        (360, 640, Transform(1.0, 1.0, 140, 0, 360, 640), ((139, 0), (500, 639))),
        # odd size: Ultralytics rounds the scaled size (1000*0.64=640, 600*0.64=384)
        (1000, 600, Transform(0.64, 0.64, 0, 128, 1000, 600), ((0, 127), (639, 512))),
    ],
)
def test_letterbox_centres_and_pads_grey(
    w: int, h: int, transform: Transform, border: tuple[tuple[int, int], tuple[int, int]]
) -> None:
    out, t = Letterbox((640, 640))(frame(w, h))
    assert out.shape == (640, 640, 3)
    assert t == transform
    (x0, y0), (x1, y1) = border
    assert (out[y0, x0] == PAD_GREY).all()  # the pad pixels next to the picture
    assert (out[y1, x1] == PAD_GREY).all()


def test_letterbox_to_stride_pads_bottom_right_only() -> None:
    image = frame(960, 540)
    out, t = Letterbox(None, pad_value=0, center=False, stride=32)(image)
    assert out.shape == (544, 960, 3)
    assert t == Transform(1.0, 1.0, 0, 0, 960, 540)
    assert (out[:540] == image).all()
    assert not out[540:].any()


def test_letterbox_top_left_into_fixed_size() -> None:
    out, t = Letterbox((640, 384), center=False)(frame(512, 512))
    assert out.shape == (384, 640, 3)
    assert t == Transform(0.75, 0.75, 0, 0, 512, 512)
    assert (out[:, 384:] == PAD_GREY).all()


def test_same_frame_size_gives_same_sample_shape_and_cached_transform() -> None:
    box = Letterbox((640, 640))
    (a, ta), (b, tb) = box(frame(800, 600)), box(frame(800, 600))
    assert a.shape == b.shape
    assert ta is tb  # computed once per frame size


def test_resize_stretches_without_padding() -> None:
    out, t = Resize((300, 300))(frame(960, 540))
    assert out.shape == (300, 300, 3)
    assert t == Transform(300 / 960, 300 / 540, 0, 0, 960, 540)


def test_boxes_map_back_through_the_transform_and_clip() -> None:
    image = frame(1280, 720)
    _, t = Letterbox((640, 640))(image)
    # model px: a box in the picture, and one reaching into the top padding and off the right
    model = np.array([[75, 260, 125, 340], [590, 130, 650, 170]], np.float32)
    assert boxes_to_frame(model, t).tolist() == [[150, 240, 250, 400], [1180, 0, 1280, 60]]


def test_points_map_back_unclipped() -> None:
    t = Transform(0.5, 0.5, 10, 20, 100, 100)
    points = np.array([[[10, 20], [0, 0]]], np.float32)
    assert points_to_frame(points, t).tolist() == [[[0, 0], [-20, -40]]]


def test_planar_rgb_matches_opencv_blob() -> None:
    image = frame(64, 48)
    expected = cv2.dnn.blobFromImage(image, 1 / 255, swapRB=True)[0]
    out = planar_rgb(image, np.dtype(np.float32), 1 / 255)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, expected)
    assert planar_rgb(image, np.dtype(np.float16)).dtype == np.float16
