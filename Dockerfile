# One image for every Python service of llm-inference-lab: gateway, router, budget, accounting,
# workers (vLLM, SGLang) and the engine simulator. Each docker-compose.yml service picks one with
# its own command (`python -m llmlab_gateway`, `python -m llmlab_worker_vllm`, ...); all
# configuration is env vars (LLMLAB_*), as for the native processes.
#
#   docker build -t llm-inference-lab:dev .
#   docker run --rm -p 8080:8080 -e LLMLAB_NATS_URL=nats://host.docker.internal:4222 \
#       -e LLMLAB_GATEWAY_HOST=0.0.0.0 llm-inference-lab:dev
#
# The real engines are not in this image: they run from their own images (vllm/vllm-openai,
# lmsysorg/sglang; see the `gpu` profile of docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what the services need (not .venv, caches, lab tools or results): the packages and the
# catalogs every service reads (LLMLAB_CATALOG_PATH defaults to configs/catalog.yaml under the
# working directory, /app).
COPY pyproject.toml ./
COPY configs/ configs/
COPY libs/ libs/
COPY services/ services/

# One pip call: the packages depend on each other by name (llmlab-common, llmlab-routing, ...), and
# every library a service declares must be in it.
RUN pip install \
        ./libs/common[service] \
        ./libs/twin \
        ./libs/routing \
        ./libs/worker \
        ./services/gateway \
        ./services/worker-vllm \
        ./services/worker-sglang \
        ./services/worker-openai \
        ./services/engine-sim \
        ./services/budget \
        ./services/router \
        ./services/accounting

# Run as an unprivileged user. Logs go to stdout; the router's decision log and accounting's chdb
# directory live under /var/lib/llmlab (compose mounts volumes there, which inherit this ownership).
RUN useradd --system --uid 10001 --no-create-home --home-dir /app --shell /usr/sbin/nologin llmlab \
    && mkdir -p /var/lib/llmlab/accounting /var/lib/llmlab/router /var/lib/llmlab/gateway && chown -R llmlab /var/lib/llmlab
USER llmlab

# gateway 8080, workers 8090, simulators 8001/8002 (each service sets its own port).
EXPOSE 8080 8090 8001 8002

# A sensible default; docker-compose.yml sets the command of every service.
CMD ["python", "-m", "llmlab_gateway"]
