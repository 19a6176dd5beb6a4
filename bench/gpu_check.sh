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
#     pyopenssl cffi pycparser google-crc32c dnspython ifaddr
# (aiortc and its dependencies: `appliance serve`, for bench/workers.py)
# Then: device run, command "sh bench/gpu_check.sh", carry [".whl"], timeout_s 480.
set -eu
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee -a "$OUT/gpu.txt"
python3 -m appliance doctor 2>&1 | tee -a "$OUT/gpu.txt" || true  # providers that really load
for bench in batching pipeline_efficiency latency; do
    timeout 120 python3 "bench/$bench.py" --quick 2>&1 | tee "$OUT/$bench.txt" || true
done
# Scaling on CUDA, 8 to 64 streams of one clock camera, where the machine has GStreamer's
# RTSP server for the camera (Debian: gir1.2-gst-rtsp-server-1.0 python3-gi).
if /usr/bin/python3 -c "import gi; gi.require_version('GstRtspServer', '1.0')" 2>/dev/null; then
    BENCH_PROVIDERS='["cuda", "cpu"]' timeout 300 python3 bench/scaling.py \
        --counts 8,16,32,64 --rounds 1 --seconds 8 --no-plot 2>&1 | tee "$OUT/scaling.txt" || true
else
    echo "no GStreamer RTSP server here: bench/scaling.py skipped" | tee "$OUT/scaling.txt"
fi
# Worker processes on a many-core machine: 32 cameras, 1 process vs 4 workers on CUDA.
if python3 -c "import aiortc" 2>/dev/null; then
    BENCH_PROVIDERS='["cuda", "cpu"]' timeout 150 python3 bench/workers.py --quick \
        --streams 32 --workers 4 2>&1 | tee "$OUT/workers.txt" || true
else
    echo "no aiortc here: bench/workers.py skipped" | tee "$OUT/workers.txt"
fi
# A short tune where a GPU is lent: the space grows (batch sizes 16 and 32, the CPU's
# intra-op threads left out) and the quick bench runs it against its grid end to end.
timeout 90 python3 bench/tune.py --quick 2>&1 | tee "$OUT/tune.txt" || true
cp bench/results/*.json "$OUT/" 2>/dev/null || true
