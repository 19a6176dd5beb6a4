"""The cases of bench/blocks.py that run a model: `classify` with a tiny classifier
through its batcher, and the two OCR stages (`detect` with `dbnet`, `ocr`) on the bundled
PP-OCRv4 models, each on the CPU as tests/ocr loads them.

The OCR frames are demo-clip frames with the read_text example's two lines drawn on
them (a camera caption and a time stamp): the clip itself has no text, and the decoder's
cost depends on the regions it finds.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from _block_cases import REGIONS, Case, regions
from _block_data import PERIOD, compiled_block, frame

from appliance.models import ModelBatcher, load_model
from pipelines.blocks.classify import ClassifyParams, Preprocess
from pipelines.blocks.ocr import CtcReader
from pipelines.decoders import DecodeOptions, build_decoder
from pipelines.spec import BatchingSpec, ModelSpec
from pipelines.types import Crops, Image
from tests.blocks.classifier_model import classifier_model
from tests.ocr import Line, draw_line, start_models, stop_models

CLASSIFIER_SIZE = (64, 64)  # "preprocessing to 64x64"
# A frame's crops are queued together (submit_many): with no queue delay they go as one
# batch at once, as tests/blocks/test_classify.py runs them.
CLASSIFIER_BATCHING = BatchingSpec(max_batch_size=16, max_queue_delay_ms=0)
TEXT_FRAMES = 8  # demo frames with text drawn on them
TEXT_CONFIDENCE, TEXT_MAX = 0.6, 50  # the read_text example's detect block
CROP_PADDING = 4  # px: the read_text example's crop block
REC_WIDTH = 320  # the ocr block's max_width default


def classify(images: list[Image], folder: Path, stack: ExitStack) -> list[Case]:
    """10 crops of about 100x100 px per frame: the block's preprocessing to 64x64 alone,
    and its whole step with the tiny colour classifier of tests/blocks behind a real
    ModelBatcher (one ONNX Runtime thread)."""
    path = folder / "colours_64.onnx"
    path.write_bytes(classifier_model(CLASSIFIER_SIZE))
    cfg = ModelSpec.model_validate(
        {"path": path, "providers": ["cpu"], "session": {"intra_op_threads": 1}}
    )
    batcher = ModelBatcher(load_model("colours", cfg, Path.resolve), CLASSIFIER_BATCHING)
    batcher.start()
    stack.callback(batcher.stop, 5.0)
    cut = compiled_block({"type": "crop", "detections": "given"})()
    dets = regions(seed=13)
    crops: list[Crops] = [cut(images[t % len(images)], dets[t]) for t in range(PERIOD)]
    prep = Preprocess(batcher.info, ClassifyParams(model="colours"))
    step = compiled_block(
        {"type": "classify", "model": "colours", "crops": "given"}, {"colours": batcher}
    )()
    frames = [frame(images[t % len(images)], t) for t in range(PERIOD)]
    return [
        Case(
            f"classify_preprocess_{REGIONS}_crops_64px_ms",
            lambda i: prep.batch(crops[i % PERIOD].images),
            reps=200,
        ),
        Case(
            f"classify_tiny_model_{REGIONS}_crops_ms",
            lambda i: step(frames[i % PERIOD].image, crops[i % PERIOD], frames[i % PERIOD]),
            reps=100,
        ),
    ]


def text_frames(images: list[Image]) -> list[tuple[Image, list[Line]]]:
    """Demo frames with a white caption at the top and a black time stamp at the bottom
    (tests/ocr's grass frame, on the clip's own frames)."""
    out = []
    for image in images[:TEXT_FRAMES]:
        drawn = image.copy()
        caption = draw_line(drawn, "CAMERA 07 PARKING", (40, 90), 1.6, 255, 3)
        stamp = draw_line(drawn, "2026-11-29 14:30", (520, 480), 1.4, 0, 3)
        out.append((drawn, [caption, stamp]))
    return out


def ocr(images: list[Image], stack: ExitStack) -> tuple[list[Case], dict[str, Any]]:
    """The two OCR stages at 960x540, and what they found (to check the cases ran on
    real text): lines detected per frame, lines read exactly."""
    models = start_models()
    stack.callback(stop_models, models)
    texts = text_frames(images)
    cases, found = detection(models["text_det"], [image for image, _ in texts])
    more, read = recognition(models["text_rec"], texts)
    checks = {
        "ocr_text_lines_drawn": sum(len(lines) for _, lines in texts),
        "ocr_text_lines_found": found,
        "ocr_text_lines_read_exactly": read,
    }
    return cases + more, checks


def _runner(batcher: ModelBatcher) -> Callable[[np.ndarray[Any, Any]], list[Any]]:
    """The model alone: its ONNX Runtime session run on a batch, as the batcher runs it."""
    model = batcher.model
    session, name = model.session, model.input_name
    return lambda batch: session.run(None, {name: batch})


def detection(det: ModelBatcher, frames: list[Image]) -> tuple[list[Case], int]:
    """DBNet: the decoder's preprocessing (resize to 960x544, normalise), the model on
    one frame, and the decoding of its probability map."""
    decoder = build_decoder(det.info, DecodeOptions(TEXT_CONFIDENCE, max_detections=TEXT_MAX))
    run = _runner(det)
    prepared = [decoder.preprocess(image) for image in frames]
    outputs = [[o[0] for o in run(sample[None])] for sample, _ in prepared]
    found = sum(
        len(decoder.decode(out, tf)) for out, (_, tf) in zip(outputs, prepared, strict=True)
    )
    n = len(frames)
    return [
        Case("dbnet_preprocess_960x540_ms", lambda i: decoder.preprocess(frames[i % n]), reps=50),
        Case("dbnet_model_960x544_ms", lambda i: run(prepared[i % n][0][None]), reps=3),
        Case(
            "dbnet_decode_ms",
            lambda i: decoder.decode(outputs[i % n], prepared[i % n][1]),
            reps=100,
        ),
    ], found


def recognition(rec: ModelBatcher, texts: list[tuple[Image, list[Line]]]) -> tuple[list[Case], int]:
    """The recogniser: preparing one line's crop (resize to 48 px high, pad to 320),
    the model on one crop and on a frame's two, and decoding the two."""
    reader, run = CtcReader(rec.info, REC_WIDTH), _runner(rec)
    crops = [_cut(image, line) for image, lines in texts for line in lines]
    samples = [reader.sample(c) for c in crops]
    pairs = [np.stack(samples[k : k + 2]) for k in range(0, len(samples), 2)]
    probs = [run(pair)[0] for pair in pairs]
    wanted = [line.text for _, lines in texts for line in lines]
    got = [text for p in probs for text in reader.decode(p)[0]]
    read = sum(w == g for w, g in zip(wanted, got, strict=True))
    n, m = len(crops), len(pairs)
    return [
        Case("ocr_prepare_crop_ms", lambda i: reader.sample(crops[i % n]), reps=200),
        Case("ocr_model_1_crop_ms", lambda i: run(samples[i % n][None]), reps=10),
        Case("ocr_model_2_crops_ms", lambda i: run(pairs[i % m]), reps=10),
        Case("ocr_decode_2_crops_ms", lambda i: reader.decode(probs[i % m]), reps=200),
    ], read


def _cut(image: Image, line: Line) -> Image:
    """A line's crop as the read_text example cuts it: its box padded by 4 px, a view."""
    x1, y1, x2, y2 = line.box
    pad = CROP_PADDING
    return image[max(0, y1 - pad) : y2 + pad, max(0, x1 - pad) : x2 + pad]
