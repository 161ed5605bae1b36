# pulse-node image: one image for the bootstrap, trainers and inference nodes (see docker-compose.yml).
#
#   docker build -t pulse-node:latest .                       # CPU torch (default)
#   docker build -t pulse-node:cuda --build-arg TORCH_INDEX_URL= .   # PyPI's torch: the CUDA build
#   (or TORCH_INDEX_URL=<the wheel index of the torch build for your CUDA>)
#
# Three stages on the official python:3.11-slim, which has no C compiler:
#   base  - Python + torch, on its own layer (the package's open torch range would otherwise let
#           pip pick a build we did not choose; every later change reuses this layer);
#   deps  - base + gcc and GMP headers: installs the dependencies into a venv that sees base's
#           torch. libp2p 0.8.1 pins fastecdsa==2.3.2, which PyPI has only as source, so it is
#           compiled here (every other dependency comes as a wheel);
#   final - base + that venv (no compiler; fastecdsa needs only libgmp10 at run time, which
#           Debian's coreutils already pulls in) + our code, installed last so a code change
#           rebuilds one small layer. The dependency layers depend on pyproject.toml alone.
FROM python:3.11-slim AS base

ARG TORCH_SPEC=torch==2.13.0
# PyTorch's CPU wheel index: a ~190 MB wheel, where PyPI's torch for Linux x86_64 is the CUDA
# build and brings several GB of nvidia-* packages
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN if [ -n "$TORCH_INDEX_URL" ]; then pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"; \
    else pip install "$TORCH_SPEC"; fi

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH


FROM base AS deps
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libgmp-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv --system-site-packages /opt/venv
WORKDIR /src
COPY pyproject.toml ./
# the dependencies only (read from pyproject.toml), so this layer survives code changes
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
        > requirements.txt \
    && pip install -r requirements.txt


FROM base AS final
# a base image without libgmp10 (not Debian's) gets it here; Debian slim images already have it
RUN dpkg -s libgmp10 >/dev/null 2>&1 || { apt-get update \
    && apt-get install -y --no-install-recommends libgmp10 && rm -rf /var/lib/apt/lists/*; }
COPY --from=deps /opt/venv /opt/venv

WORKDIR /opt/pulse-node
COPY pyproject.toml README.md ./
COPY pulse_node ./pulse_node
# --no-deps: the venv already holds them; pip check proves the set is complete and consistent,
# and importing libp2p proves the compiled fastecdsa finds its run-time libraries without a compiler
RUN pip install --no-deps . && pip check && python -c "import libp2p" && pulse-node --version

COPY configs /configs

# an unprivileged user; named volumes mounted on these dirs inherit its ownership
ENV NUMBA_CACHE_DIR=/opt/numba-cache
RUN useradd --create-home --uid 1000 pulse \
    && mkdir -p /data /state /shared "$NUMBA_CACHE_DIR" \
    && chown pulse:pulse /data /state /shared "$NUMBA_CACHE_DIR"
USER pulse
WORKDIR /home/pulse
# the numba kernels (the codec's, the robust rule's) compiled once here (~1 MB), not in every new
# container (~10 s of CPU each); on a CPU other than the build machine's, numba recompiles into the
# same directory
RUN python -c "from pulse_node.codec.warmup import warm_up; warm_up()" \
    && python -c "from pulse_node.loco.clip_kernel import warm; warm()"

# 31337: bootstrap DHT port; 9100: /metrics /health /status of a node (inside the container)
EXPOSE 31337 9100
CMD ["pulse-node", "--help"]
