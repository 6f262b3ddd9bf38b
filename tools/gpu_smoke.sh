#!/usr/bin/env sh
# The GPU smoke test (tools/gpu_smoke.py): run it first on a GPU node with the TLT image, e.g.
#   kubectl run tlt-smoke --rm -it --image=<tlt image> --overrides='<a pod with one nvidia.com/gpu>' -- \
#     tools/gpu_smoke.sh --model /models/policy
# Prints PASS/FAIL per step; exits non-zero when a step failed.
set -eu
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
exec python tools/gpu_smoke.py "$@"
