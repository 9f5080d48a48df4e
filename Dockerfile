# syntax=docker/dockerfile:1
# One image for every Fjord service: `fjord broker|controller|coordinator|operator ...`
# (entrypoint `fjord`, the console script of pyproject.toml). Built elsewhere (no Docker engine
# runs where Fjord is developed):  docker build -t fjord/fjord:0.1.0 .
# Ports are the conventions of the chart and the operator (docs/kubernetes.md): 9092 broker
# (fjord.broker.defaults.DEFAULT_BROKER_PORT), 9093 controller, 9094 coordinator, 9095 the
# brokers' Kafka listener, 9404 metrics.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the fjord wheel (its C extension compiled here; dependencies ship binary wheels) -
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# gcc compiles the C extension fjord.records._speedups into the wheel (setup.py; without it the
# wheel is pure Python and Fjord runs the same code slower: docs/performance.md). This stage
# only: the runtime image gets the wheel, no compiler. Versions unpinned (DL3008): Debian's
# security updates replace them in the archive, so a pin would stop the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY services ./services
COPY operator ./operator
COPY spark/fjord_spark ./spark/fjord_spark
COPY spark/fjord_jobs ./spark/fjord_jobs
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# --- runtime: the wheel, its dependencies and the `operator` extra; no build tools --------------
FROM ${PYTHON_IMAGE}
# FJORD_METRICS_HOST: /metrics on every interface (the default is loopback), so the kubelet's
# probes and Prometheus reach it on the pod's address.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FJORD_METRICS_HOST=0.0.0.0
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install "$(ls /wheels/fjord-*.whl)[operator]" \
    && groupadd --system --gid 10001 fjord \
    && useradd --system --uid 10001 --gid fjord --no-create-home --home-dir /var/lib/fjord \
       --shell /usr/sbin/nologin fjord \
    && install -d -o fjord -g fjord -m 0750 /var/lib/fjord
USER 10001:10001
WORKDIR /var/lib/fjord
# Brokers keep their partition logs here (a PersistentVolume in Kubernetes).
VOLUME ["/var/lib/fjord"]
# 9097: the SASL gRPC doors (spec.security.saslGrpcDoor); other Kafka listeners are spec.listeners' ports.
EXPOSE 9092 9093 9094 9095 9097 9404
# No HEALTHCHECK: Kubernetes ignores it; the pods' probes use /metrics on 9404.
ENTRYPOINT ["fjord"]
CMD ["--help"]
