# pulse-node image: one image for the bootstrap, trainers and inference nodes (see docker-compose.yml).
#
#   docker build -t pulse-node:latest .                       # CPU torch (default)
#   docker build -t pulse-node:cuda --build-arg TORCH_SPEC=torch==2.13.0 \
#       --build-arg TORCH_INDEX_URL=<the wheel index of the torch build for your CUDA> .
#
# torch is installed first and on its own layer: the package's open torch range would otherwise
# let pip pick a build we did not choose, and rebuilding after a code change reuses this layer.
FROM python:3.11-slim

ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN if [ -n "$TORCH_INDEX_URL" ]; then pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"; \
    else pip install "$TORCH_SPEC"; fi

WORKDIR /opt/pulse-node
COPY pyproject.toml README.md ./
COPY pulse_node ./pulse_node
RUN pip install . && pulse-node --version && pip check

COPY configs /configs

# an unprivileged user; named volumes mounted on these dirs inherit its ownership
RUN useradd --create-home --uid 1000 pulse \
    && mkdir -p /data /state /shared \
    && chown pulse:pulse /data /state /shared
USER pulse
WORKDIR /home/pulse

# 31337: bootstrap DHT port; 9100: /metrics /health /status of a node (inside the container)
EXPOSE 31337 9100
CMD ["pulse-node", "--help"]
