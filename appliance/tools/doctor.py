"""`appliance doctor`: what this machine offers the appliance, checked rather than assumed.

ONNX Runtime's build and, for each provider it was built with, whether that provider's
libraries really load here (`get_available_providers()` lists what was compiled in, not
what works); each GPU's memory and utilisation and the driver, from NVML (the `cuda`
extra's nvidia-ml-py); PyAV's FFmpeg with its H.264/H.265 decoders, the hardware decoders
compiled in and the hardware devices it can really open; with `--config`, the decoder each
stream would get and why, and whether the API would be served over TLS (server.tls) and
its files load (readable, the key the certificate's, and until when it is valid); the
versions of what the appliance runs on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config's modules load when --config is given only
    from appliance.config import AppConfig

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
_MIB = 1 << 20  # NVML reports bytes


def add_doctor_command(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="what this machine offers: providers, GPU, codecs")
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument(
        "--config",
        type=Path,
        help="also say which decoder each of its streams would get, and whether its API "
        "would be served over TLS",
    )
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from appliance.config import ConfigError

    try:
        report = examine(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"python {report['python']} on {report['platform']}")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in report["packages"].items()))
    print(f"onnxruntime {report['onnxruntime']['version']} ({report['onnxruntime']['build']})")
    for name, problem in report["onnxruntime"]["providers"].items():
        print(f"  {name}: {problem or 'ok'}")
    _print_gpus(report["gpus"])
    _print_media(report["media"])
    if "streams" in report:
        print(f"decoders of {args.config}'s streams:")
    for stream in report.get("streams", []):
        why = f" ({stream['problem']})" if stream["problem"] else ""
        print(f"  stream {stream['id']}: hwaccel {stream['hwaccel']} -> {stream['decoder']}{why}")
    if "api" in report:
        print(f"api: {api_line(report['api'])}")
    return 0


def api_line(api: dict[str, Any]) -> str:
    """`api_tls`'s report in one line."""
    if not api["tls"]:
        return "plain HTTP (server.tls is not set)"
    cert = api["certificate"]
    if cert is None:
        return f"over TLS, but its files do not load: {api['problem']}"
    shown = f"{cert['subject']}, serial {cert['serial']}, valid until {cert['not_after']}"
    return f"over TLS ({shown})" + (f": {api['problem']}" if api["problem"] else "")


def _print_gpus(gpus: dict[str, Any]) -> None:
    if gpus["problem"] is not None:
        print(f"gpus: none seen ({gpus['problem']})")
        return
    print(f"gpus: driver {gpus['driver']}, {len(gpus['devices'])} found")
    for gpu in gpus["devices"]:
        print(
            f"  {gpu['index']}: {gpu['name']}, memory {gpu['memory_used_mib']}/"
            f"{gpu['memory_total_mib']} MiB, utilisation {gpu['utilization_percent']}%"
        )


def _print_media(media: dict[str, Any]) -> None:
    print(f"ffmpeg (PyAV): libavcodec {media['libavcodec']}")
    print(f"  decoders: {', '.join(media['decoders']) or 'none'}")
    print(f"  hardware decoders compiled in: {', '.join(media['hardware']) or 'none'}")
    print(f"  hardware device types (hwdevices_available): {', '.join(media['hwaccel'])}")
    print(f"  cuda decoding (NVDEC): {media['cuda_decode'] or 'a device opens'}")


def examine(config: Path | None = None) -> dict[str, Any]:
    """Everything `doctor` reports, as JSON-ready values; with `config` (a config file),
    also each stream's decoder (ConfigError when the file is not a valid config)."""
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": _packages(),
        "onnxruntime": _onnxruntime(),
        "gpus": gpus(),
        "media": _media(),
    }
    if config is not None:
        from appliance.config import load_config

        loaded = load_config(config)  # once, for both
        report["streams"] = stream_decoders(loaded)
        report["api"] = api_tls(loaded)
    return report


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


def gpus() -> dict[str, Any]:
    """Each GPU NVML sees: name, memory used/total (MiB), utilisation (%) over NVML's last
    sample period (1/6 s to 1 s, by GPU); and the driver. `problem` says plainly why
    there are none: no nvidia-ml-py, no driver, no GPU."""
    try:
        import pynvml
    except ImportError:
        return _no_gpus("NVML unavailable: nvidia-ml-py is not installed (appliance[cuda])")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return _no_gpus(f"no NVIDIA driver: {exc}")
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        devices = [gpu_row(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as exc:
        return _no_gpus(f"NVML: {exc}")
    finally:
        pynvml.nvmlShutdown()
    return {
        "problem": None if devices else "NVML sees no GPU",
        "driver": driver,
        "devices": devices,
    }


def _no_gpus(problem: str) -> dict[str, Any]:
    return {"problem": problem, "driver": None, "devices": []}


def gpu_row(nvml: Any, index: int) -> dict[str, Any]:
    """One GPU as `gpus` lists it, read through the NVML module `nvml` (pynvml)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "index": index,
        "name": nvml.nvmlDeviceGetName(handle),
        "memory_used_mib": memory.used // _MIB,
        "memory_total_mib": memory.total // _MIB,
        "utilization_percent": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
    }


def stream_decoders(config: AppConfig) -> list[dict[str, Any]]:
    """For each stream of `config`: its `source.decoder.hwaccel`, the decoder it would
    get on this machine (`cuda` or `software`) and why a requested one is refused."""
    from appliance.sources.pyav import DecoderPlan

    rows = []
    for stream in config.streams:
        plan = DecoderPlan.of(stream.source.decoder)
        rows.append(
            {
                "id": stream.id,
                "hwaccel": stream.source.decoder.hwaccel,
                "decoder": "software" if plan.hwaccel is None else "cuda",
                "problem": plan.problem,
            }
        )
    return rows


def api_tls(config: AppConfig) -> dict[str, Any]:
    """Whether `appliance serve` would serve `config`'s API over TLS (`tls`) and, if so,
    the certificate its files make (`certificate`: subject, serial, validity), read as
    the server reads them, or why they do not (`problem`: a file not readable, a key
    that is not the certificate's, a certificate not valid now)."""
    from appliance.policy.files import FilePolicy
    from appliance.server.tls import TlsFileError, load

    if config.server.tls is None:
        return {"tls": False, "certificate": None, "problem": None}
    try:
        _, cert = load(config.server.tls, FilePolicy.owner(config))
    except TlsFileError as exc:
        return {"tls": True, "certificate": None, "problem": str(exc)}
    problem = "not valid now: clients refuse it" if cert.expired else None
    return {"tls": True, "certificate": dataclasses.asdict(cert), "problem": problem}


def _media() -> dict[str, Any]:
    import av
    from av.codec.hwaccel import hwdevices_available

    from appliance.sources.pyav import device_problem

    codecs = set(av.codecs_available)
    libavcodec = ".".join(map(str, av.library_versions.get("libavcodec", ())))
    decoders = sorted(c for c in ("h264", "hevc", "mjpeg", "vp8", "vp9", "av1") if c in codecs)
    hardware = sorted(c for c in codecs if c.rsplit("_", 1)[-1] in HW_DECODERS)
    return {
        "pyav": av.__version__,
        "libavcodec": libavcodec,
        "decoders": decoders,
        "hardware": hardware,
        "hwaccel": hwdevices_available(),  # the device types this FFmpeg was built for
        # Why `source.decoder.hwaccel: cuda` would decode in software here; None: it opens.
        "cuda_decode": device_problem("cuda", 0),
    }
