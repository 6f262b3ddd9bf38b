# syntax=docker/dockerfile:1
# One image for every TLT component; the command picks it (python -m rollout_server | drafter_service |
# trainer | rollout_server.spot_worker | rollout_server.policy_follower). Not built on the project's
# machines (no Docker engine there): see README "Kubernetes" for how to check it.
#
#   GPU (default):  docker build -t tlt .
#   CPU:            docker build -t tlt:cpu --build-arg BASE=ubuntu:24.04 --build-arg TARGET=cpu .
ARG BASE=nvidia/cuda:12.9.1-cudnn-runtime-ubuntu24.04
FROM ${BASE}

ARG TARGET=gpu
# GPU: SGLang with its CUDA kernels (flashinfer, sgl-kernel) from its own package metadata.
ARG SGLANG_GPU_SPEC="sglang[all]==0.5.23"

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m pip install --no-cache-dir --break-system-packages uv \
 && uv python install 3.11 \
 && uv venv --python 3.11 /opt/venv
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH

WORKDIR /app
COPY requirements/ requirements/
RUN if [ "$TARGET" = "gpu" ]; then \
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
RUN uv pip install --no-cache -c requirements/lock.txt .

RUN useradd --uid 1000 --create-home tlt
USER 1000
EXPOSE 30000 50051 50061
CMD ["tlt", "--help"]
