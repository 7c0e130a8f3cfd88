# syntax=docker/dockerfile:1
# nodbot's image (docs/operations.md, "Deployment"):
#   docker build -t nodbot .
#   docker run --rm -p 8080:8080 --env-file nodbot.env \
#       -v "$PWD/nodbot.yml:/etc/nodbot/nodbot.yml:ro" nodbot
# The first stage downloads the versions uv.lock pins for nodbot and its `bot` extra, checked
# against the lock's hashes, and builds nodbot's wheel; the second installs them, without
# reaching an index, into a virtual environment and runs the bot as an unprivileged user. No
# configuration or secret is in the image: the configuration is mounted at
# /etc/nodbot/nodbot.yml, the secrets come from the environment (${VAR} in it).

# A tag names the Python minor version and the Debian release; pin a digest
# (python:3.11-slim-trixie@sha256:...) for byte-identical rebuilds.
FROM python:3.11-slim-trixie AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# uv only reads the lock (the version the Makefile uses); pip downloads and checks.
RUN pip install --no-cache-dir uv==0.13.9
COPY . .
# --locked: a lock older than pyproject.toml fails the build instead of being ignored.
RUN mkdir -p /wheels \
    && uv export --locked --extra bot --no-emit-project --format requirements-txt \
        --output-file /wheels/requirements.txt \
    && pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels \
        --requirement /wheels/requirements.txt \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .


FROM python:3.11-slim-trixie

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/nodbot/venv/bin:$PATH

# The wheels are bind-mounted for this step only, so none of them stays in a layer.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/nodbot/venv \
    && /opt/nodbot/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels \
        --require-hashes --requirement /wheels/requirements.txt \
    && /opt/nodbot/venv/bin/pip install --no-cache-dir --no-index --no-deps \
        /wheels/nodbot-*.whl \
    && groupadd --system --gid 10001 nodbot \
    && useradd --system --uid 10001 --gid nodbot --home-dir /var/lib/nodbot \
        --no-create-home --shell /usr/sbin/nologin nodbot \
    && mkdir -p /etc/nodbot /var/lib/nodbot \
    && chown nodbot:nodbot /var/lib/nodbot

# A relative SQLite path (sqlite:///nodbot.db) lands here: mount a volume on it to keep it.
WORKDIR /var/lib/nodbot
# Numeric, so that an orchestrator's "run as non-root" check can verify it.
USER 10001:10001

EXPOSE 8080
# slim has no curl. urlopen raises on a 503, so an unhealthy bot fails the check; the port
# is server.port of nodbot.yml, which deploy/nodbot.yml reads from NODBOT_PORT.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('NODBOT_PORT', '8080') + '/healthz', timeout=4)"]

# nodbot serve stops gracefully on SIGTERM (docker stop's signal); as PID 1 it gets it.
ENTRYPOINT ["nodbot"]
CMD ["serve", "--config", "/etc/nodbot/nodbot.yml"]
