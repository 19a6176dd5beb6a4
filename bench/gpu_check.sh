#!/bin/sh
# The GPU checks, as one short run on a lent GPU machine (see the device tool's README).
#
# Prepare once here (the GPU machine has no network; its python3 is 3.12 and has numpy,
# opencv-python-headless, aiohttp, PyYAML, prometheus-client and a CPU onnxruntime):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl onnxruntime-gpu av pydantic pydantic-core \
#     annotated-types typing-inspection psutil aiortc aioice pyee pylibsrtp cryptography \
#     pyopenssl cffi pycparser google-crc32c dnspython ifaddr onnx ml-dtypes protobuf \
#     nvidia-ml-py
# (aiortc and its dependencies: `appliance serve`, for bench/workers.py; onnx with
# ml-dtypes and protobuf: the graph preprocessing's prologue (`models.<id>.preprocess`);
# nvidia-ml-py: NVML for doctor's GPU report and bench/gpu_acceptance.py's GPU figures)
# Then: device run, command "sh bench/gpu_check.sh [PART ...]", carry [".whl"].
# PARTs, in this order: acceptance (~6 min: bench/gpu_acceptance.py), quick (~4 min:
# doctor and the quick benches), scaling, workers, ceiling (~4 min), tune; default all.
# Everything does not fit one device call (600 s at most, 15 min of device time a
# session): run "acceptance" first (timeout_s 420), then "ceiling quick" if time is left.
set -eu
PARTS=" ${*:-acceptance quick scaling workers ceiling tune} "
want() { case "$PARTS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee -a "$OUT/gpu.txt"
python3 -m appliance doctor 2>&1 | tee -a "$OUT/gpu.txt" || true  # providers that really load
# Issue 31's acceptance: 8 to 64 live 1080p30 cameras, detect + track, profiling on, with
# software and NVDEC decoding: 8 rows of ~20 s each (start, 3 s warm-up, 8 s window, stop),
# and the 1080p30 clip encoded once at the start.
if want acceptance; then
    timeout 360 python3 bench/gpu_acceptance.py --counts 8,16,32,64 --hwaccel none,cuda \
        --seconds 8 2>&1 | tee "$OUT/gpu_acceptance.txt" || true
fi
if want quick; then
    for bench in batching pipeline_efficiency latency; do
        timeout 120 python3 "bench/$bench.py" --quick 2>&1 | tee "$OUT/$bench.txt" || true
    done
fi
# Scaling on CUDA, 8 to 64 streams of one clock camera, where the machine has GStreamer's
# RTSP server for the camera (Debian: gir1.2-gst-rtsp-server-1.0 python3-gi).
if ! want scaling; then
    :
elif /usr/bin/python3 -c "import gi; gi.require_version('GstRtspServer', '1.0')" 2>/dev/null; then
    BENCH_PROVIDERS='["cuda", "cpu"]' timeout 300 python3 bench/scaling.py \
        --counts 8,16,32,64 --rounds 1 --seconds 8 --no-plot 2>&1 | tee "$OUT/scaling.txt" || true
else
    echo "no GStreamer RTSP server here: bench/scaling.py skipped" | tee "$OUT/scaling.txt"
fi
# Worker processes on a many-core machine: 32 cameras, 1 process vs 4 workers on CUDA.
if ! want workers; then
    :
elif python3 -c "import aiortc" 2>/dev/null; then
    BENCH_PROVIDERS='["cuda", "cpu"]' timeout 150 python3 bench/workers.py --quick \
        --streams 32 --workers 4 2>&1 | tee "$OUT/workers.txt" || true
else
    echo "no aiortc here: bench/workers.py skipped" | tee "$OUT/workers.txt"
fi
# The ceiling (issue 42) with the demo's real models on CUDA: 8 and 16 fast streams, one
# round, the bare decode loop, one process and 2 workers (the reference needs a network
# for its venv: left out here; MQTT where mosquitto is installed).
if ! want ceiling; then
    :
elif python3 -c "import aiortc" 2>/dev/null; then
    BENCH_PROVIDERS='["cuda", "cpu"]' timeout 240 python3 bench/ceiling.py --models real \
        --counts 8,16 --rounds 1 --workflows people 2>&1 | tee "$OUT/ceiling.txt" || true
else
    echo "no aiortc here: bench/ceiling.py skipped" | tee "$OUT/ceiling.txt"
fi
# A short tune where a GPU is lent: the space grows (batch sizes 16 and 32, the CPU's
# intra-op threads left out) and the quick bench runs it against its grid end to end.
if want tune; then
    timeout 90 python3 bench/tune.py --quick 2>&1 | tee "$OUT/tune.txt" || true
fi
cp bench/results/*.json "$OUT/" 2>/dev/null || true
