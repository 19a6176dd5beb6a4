"""`appliance doctor`: what this machine offers the appliance, checked rather than assumed.

ONNX Runtime's build and, for each provider it was built with, whether that provider's
libraries really load here (`get_available_providers()` lists what was compiled in, not
what works); the GPUs and driver NVIDIA's tool reports; PyAV's FFmpeg with its H.264/H.265
decoders and the hardware decoders compiled in; the versions of what the appliance runs on.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGES = (
    "appliance",
    "onnxruntime-gpu",
    "onnxruntime",
    "av",
    "numpy",
    "opencv-python-headless",
    "aiortc",
    "paho-mqtt",
    "prometheus-client",
)
HW_DECODERS = ("cuvid", "qsv", "vaapi", "videotoolbox", "v4l2m2m")  # FFmpeg's suffixes
NVIDIA_SMI_TIMEOUT_S = 10.0


def add_doctor_command(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="what this machine offers: providers, GPU, codecs")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    report = examine()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"python {report['python']} on {report['platform']}")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in report["packages"].items()))
    print(f"onnxruntime {report['onnxruntime']['version']} ({report['onnxruntime']['build']})")
    for name, problem in report["onnxruntime"]["providers"].items():
        print(f"  {name}: {problem or 'ok'}")
    gpus = report["gpus"]
    print("gpus: " + ("; ".join(gpus) if gpus else "none found (no nvidia-smi, or no GPU)"))
    media = report["media"]
    print(f"ffmpeg (PyAV): libavcodec {media['libavcodec']}")
    print(f"  decoders: {', '.join(media['decoders']) or 'none'}")
    print(f"  hardware decoders compiled in: {', '.join(media['hardware']) or 'none'}")
    return 0


def examine() -> dict[str, Any]:
    """Everything `doctor` reports, as JSON-ready values."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": _packages(),
        "onnxruntime": _onnxruntime(),
        "gpus": _gpus(),
        "media": _media(),
    }


def _packages() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _onnxruntime() -> dict[str, Any]:
    import onnxruntime as ort

    from appliance.models.session import PROVIDERS, provider_problem

    names = {ort_name: name for name, ort_name in PROVIDERS.items()}
    providers = {
        p: provider_problem(names[p]) if p in names else None for p in ort.get_available_providers()
    }
    return {"version": ort.__version__, "build": ort.get_device(), "providers": providers}


def _gpus() -> list[str]:
    """`NVIDIA H200, driver 570.86` per GPU, from nvidia-smi; [] without one."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    query = [tool, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        done = subprocess.run(
            query, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"nvidia-smi failed: {exc}"]
    if done.returncode != 0:
        return [f"nvidia-smi: {(done.stderr or done.stdout).strip()[:200]}"]
    rows = [line.split(", ") for line in done.stdout.strip().splitlines()]
    return [f"{r[0]}, driver {r[1]}, {r[2]}" if len(r) == 3 else ", ".join(r) for r in rows]


def _media() -> dict[str, Any]:
    import av

    codecs = set(av.codecs_available)
    libavcodec = ".".join(map(str, av.library_versions.get("libavcodec", ())))
    decoders = sorted(c for c in ("h264", "hevc", "mjpeg", "vp8", "vp9", "av1") if c in codecs)
    hardware = sorted(c for c in codecs if c.rsplit("_", 1)[-1] in HW_DECODERS)
    return {
        "pyav": av.__version__,
        "libavcodec": libavcodec,
        "decoders": decoders,
        "hardware": hardware,
    }
