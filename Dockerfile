# syntax=docker/dockerfile:1
# One image for every TLT component; the command picks it (python -m rollout_server | drafter_service |
# trainer | rollout_server.spot_worker | rollout_server.policy_follower). Not built on the project's
# machines (no Docker engine there): tests/test_image.py checks its layout, and `tools/gpu_smoke.sh`
# is the first thing to run in it on a GPU node (README "Kubernetes").
#
#   GPU (default):  docker build -t tlt .
#   CPU:            docker build -t tlt:cpu --build-arg BASE=ubuntu:24.04 --build-arg TARGET=cpu .
#
# GPU base: SGLang 0.5.23 pins torch 2.14.1, whose PyPI build is for CUDA 13.0, so the node's driver
# must be 580 or newer (an older one makes torch see no GPU: the rollout server then refuses to start
# rather than serve on the CPU, since the image pins --device cuda). flashinfer 0.7.2 (SGLang's pin)
# compiles its kernels at first use and PyPI has no prebuilt cubins of that version: the base is the
# CUDA *devel* image, whose nvcc and headers that compilation needs.
ARG BASE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
FROM ${BASE}

# cuda or cpu: the device every process of the image uses.
ARG TARGET=cuda
# cuda: SGLang with its CUDA kernels (flashinfer, sgl-kernel) from its own package metadata.
ARG SGLANG_GPU_SPEC="sglang[all]==0.5.23"

# The interpreter and the virtual environment live under /opt, readable by every user: `uv python
# install` would otherwise put the interpreter under /root (mode 0700), out of reach of UID 1000.
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python UV_CACHE_DIR=/tmp/uv-cache
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m pip install --no-cache-dir --break-system-packages uv \
 && uv python install 3.11 \
 && uv venv --python 3.11 /opt/venv \
 && chmod -R a+rX /opt/python /opt/venv
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH

WORKDIR /app
COPY requirements/ requirements/
RUN if [ "$TARGET" = "cuda" ]; then \
      uv pip install --no-cache "$SGLANG_GPU_SPEC"; \
    else \
      uv pip install --no-cache -c requirements/lock.txt -r requirements/sglang-cpu.txt \
      && uv pip install --no-cache --no-deps -c requirements/lock.txt sglang==0.5.23; \
    fi

COPY pyproject.toml README.md ./
COPY tlt/ tlt/
COPY rollout_server/ rollout_server/
COPY drafter_service/ drafter_service/
COPY trainer/ trainer/
COPY tools/gpu_smoke.sh tools/gpu_smoke.py tools/
RUN uv pip install --no-cache -c requirements/lock.txt . \
 && rm -rf /tmp/uv-cache

# The device every process uses, pinned: the GPU image never falls back to the CPU (TLT_*_DEVICE are
# read by the rollout server, the trainer and the spot worker).
ENV TLT_ROLLOUT_DEVICE=${TARGET} TLT_TRAINER_DEVICE=${TARGET} TLT_SPOT_DEVICE=${TARGET}

RUN useradd --uid 1000 --create-home tlt
USER 1000
# Fails the build when the non-root user cannot start the interpreter.
RUN python -c "import sys, tlt; assert sys.prefix == '/opt/venv'"
EXPOSE 30000 50051 50061
CMD ["tlt", "--help"]
