"""blur: only the (padded) regions change, in a new image; the input is never written."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from pipelines.blocks.base import BuildContext
from pipelines.blocks.blur import BlurBlock, BlurParams
from pipelines.compiler import compile_workflow
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry
from pipelines.types import Detections, Image
from tests.blocks.tracking_clips import doc_example, frame, render
from tests.decoders.ort_runner import photo

CTX = BuildContext(models={})
# The documented examples run with `detect` replaced by a contour finder (no model).
DOC_REGISTRY = BlockRegistry(
    {**BUILTIN_BLOCKS, "contours": "tests.blocks.tracking_clips:ContoursBlock"}
)
REGIONS = [(100, 60, 260, 220), (600, 300, 700, 420)]  # x1, y1, x2, y2 in px


def blur(image: Image, dets: Detections, **params: Any) -> Image:
    step = BlurBlock.build(BlurParams.model_validate(params), CTX)()
    result: Image = step(image, dets)
    return result


def boxes(*xyxy: tuple[float, ...]) -> Detections:
    return Detections.from_arrays(xyxy, [0.9] * len(xyxy), [0] * len(xyxy))


def inside(shape: tuple[int, ...], regions: list[tuple[int, int, int, int]]) -> np.ndarray:
    mask = np.zeros(shape[:2], bool)
    for x1, y1, x2, y2 in regions:
        mask[y1:y2, x1:x2] = True
    return mask


@pytest.fixture(scope="module")
def grass() -> Image:
    """grass.png (fine texture everywhere) tiled to 960x540."""
    tile = photo("grass")
    return np.ascontiguousarray(np.tile(tile, (2, 2, 1))[:540, :960])


@pytest.mark.parametrize("method", ["gaussian", "pixelate", "fill"])
def test_only_the_regions_change(grass: Image, method: str) -> None:
    before = grass.copy()
    out = blur(grass, boxes(*REGIONS), method=method)
    assert out is not grass and out.shape == grass.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(grass, before)  # the input is untouched
    mask = inside(grass.shape, REGIONS)
    np.testing.assert_array_equal(out[~mask], grass[~mask])  # byte-identical outside
    changed = np.any(out != grass, axis=2)
    assert changed[mask].mean() > 0.9  # nearly every pixel inside differs


def test_gaussian_smooths_texture(grass: Image) -> None:
    x1, y1, x2, y2 = REGIONS[0]
    out = blur(grass, boxes(REGIONS[0]), method="gaussian", kernel=31)

    def sharpness(im: Image) -> float:
        return float(cv2.Laplacian(cv2.cvtColor(im, cv2.COLOR_BGR2GRAY), cv2.CV_64F).var())

    assert sharpness(out[y1:y2, x1:x2]) < 0.05 * sharpness(grass[y1:y2, x1:x2])


def test_pixelate_makes_uniform_blocks(grass: Image) -> None:
    out = blur(grass, boxes((100, 60, 260, 220)), method="pixelate", pixel_size=16)
    region = out[60:220, 100:260].astype(int)  # 160 px = 10 blocks of 16 px
    blocks = region.reshape(10, 16, 10, 16, 3)
    assert np.all(blocks.max(axis=(1, 3)) == blocks.min(axis=(1, 3)))
    assert len(np.unique(region.reshape(-1, 3), axis=0)) > 20  # but not one colour


def test_fill_paints_the_colour_in_bgr(grass: Image) -> None:
    out = blur(grass, boxes(REGIONS[1]), method="fill", color="#FF8000")
    x1, y1, x2, y2 = REGIONS[1]
    assert np.all(out[y1:y2, x1:x2] == (0, 128, 255))  # "#FF8000" is orange: B=0 G=128 R=255


def test_padding_grows_the_changed_area(grass: Image) -> None:
    out = blur(grass, boxes((100, 100, 200, 150)), method="fill", padding=0.1, padding_px=2)
    padded = [(88, 93, 212, 157)]  # 10 % of 100 x 50, plus 2 px, each side
    mask = inside(grass.shape, padded)
    assert np.all(out[mask] == 0)
    np.testing.assert_array_equal(out[~mask], grass[~mask])


def test_edges_clip_and_nothing_to_blur_returns_the_input(grass: Image) -> None:
    out = blur(grass, boxes((-50, -50, 40, 30)), method="fill")
    mask = inside(grass.shape, [(0, 0, 40, 30)])
    assert np.all(out[mask] == 0) and np.array_equal(out[~mask], grass[~mask])
    assert blur(grass, Detections.empty()) is grass  # no copy when nothing changes
    assert blur(grass, boxes((2000, 0, 2100, 50))) is grass  # wholly outside


def test_real_face_is_anonymised() -> None:
    image = photo("astronaut")
    face = (180, 60, 290, 190)  # around the astronaut's face, px
    out = blur(image, boxes(face), strength=0.5)
    x1, y1, x2, y2 = face
    assert cv2.absdiff(out[y1:y2, x1:x2], image[y1:y2, x1:x2]).mean() > 10
    assert np.array_equal(out[:, :x1], image[:, :x1])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"kernel": 31, "strength": 0.5}, "not both"),
        ({"kernel": 30}, "odd"),
        ({"method": "smudge"}, "gaussian"),
        ({"color": "red"}, "pattern"),
    ],
)
def test_invalid_parameters_say_why(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BlurParams.model_validate(bad)


def test_the_documented_example_compiles_and_runs() -> None:
    run = compile_workflow(doc_example("blur"), CTX, DOC_REGISTRY).instantiate()
    image = render([(40, 40, 80, 80)])  # white square on dark grey
    video = run.run(frame(image)).drawn()
    # Padding 0.15 x 40 = 6 px: the blurred region is 28-92 px (edges soften there).
    changed = np.argwhere(np.any(video != image, axis=2))
    assert changed.min(axis=0).tolist() >= [28, 28] and changed.max(axis=0).tolist() <= [91, 91]
    assert video[40, 40].tolist() != [255, 255, 255]  # the square's corner is softened
