# One image for every pai service; the command picks the service:
#   pai-api          the REST API under gunicorn (port 9186)          runs as user pai
#   pai-scheduler    the scheduler and its periodic repair loop        runs as user pai
#   pai-node-agent   a node's launcher and monitor (needs the Docker socket: run as root)
#   pai-launcher, pai-monitor, pai, pai-healthcheck
#
# Build arguments (all optional):
#   BASE_IMAGE     a Debian-based image, default python:3.11-slim. A plain Debian
#                  image without Python works too (Debian's python3 is installed),
#                  e.g. the debootstrap image of scripts/build-base-image.sh.
#   EXTRA_CA       a PEM bundle inside the build context that pip must trust, for a
#                  TLS-inspecting proxy or a mirror with its own CA (default: none).
#   PIP_INDEX_URL  a PyPI mirror; HTTP_PROXY / HTTPS_PROXY / NO_PROXY as usual.
# e.g.  docker build -t pai --build-arg EXTRA_CA=build/extra-ca.pem .
ARG BASE_IMAGE=python:3.11-slim

# --- builder: a virtual environment with pai and its dependencies -------------
FROM ${BASE_IMAGE} AS builder
ARG EXTRA_CA=deploy/image/no-extra-ca.pem
ARG PIP_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 DEBIAN_FRONTEND=noninteractive
RUN set -eu; \
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then \
        apt-get update; \
        apt-get install -y --no-install-recommends python3 python3-venv; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/pai
COPY ${EXTRA_CA} /tmp/extra-ca.pem
# pip trusts its own CA bundle plus EXTRA_CA (this stage is thrown away).
RUN set -eu; \
    /opt/pai/bin/python -c 'from pip._vendor import certifi; print(certifi.where())' \
        | xargs cat >/tmp/pip-ca.pem; \
    cat /tmp/extra-ca.pem >>/tmp/pip-ca.pem
ENV PIP_CERT=/tmp/pip-ca.pem
# Dependencies first, in their own layer: a code change does not reinstall them.
# Two distributions: the server (pyproject.toml) and the `pai` CLI (cli/).
COPY pyproject.toml README.md /src/
COPY cli/pyproject.toml cli/README.md /src/cli/
RUN /opt/pai/bin/python -c 'import tomllib; \
print("\n".join(d for p in ("/src/pyproject.toml", "/src/cli/pyproject.toml") \
                 for d in tomllib.load(open(p, "rb"))["project"]["dependencies"]))' \
        >/tmp/requirements.txt \
    && /opt/pai/bin/pip install -r /tmp/requirements.txt
COPY shared /src/shared
COPY services /src/services
COPY cli/pai_cli /src/cli/pai_cli
RUN /opt/pai/bin/pip install --no-deps /src /src/cli \
    && /opt/pai/bin/pip uninstall -y pip \
    && /opt/pai/bin/python -c 'import services.api.app, services.scheduler.run, \
services.launcher.run, services.monitor.run, pai_cli.main'
COPY deploy/image/pai-healthcheck /opt/pai/bin/
RUN chmod 0755 /opt/pai/bin/pai-healthcheck

# --- the image: the base, Python, the virtual environment, no build tools -----
FROM ${BASE_IMAGE}
RUN set -eu; \
    if ! python3 -c 'import sys' 2>/dev/null; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3; \
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    fi; \
    groupadd --gid 10001 pai; \
    useradd --uid 10001 --gid pai --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin pai
COPY --from=builder /opt/pai /opt/pai
# The web portal's submit editor starts from these (docs/portal.md).
COPY examples/hello-world.json examples/v2-two-roles.yaml /opt/pai/examples/
ENV PATH=/opt/pai/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    XDG_RUNTIME_DIR=/tmp \
    PAI_API_HOST=0.0.0.0
LABEL org.opencontainers.image.title="pai" \
      org.opencontainers.image.description="pai GPU job platform: api, scheduler and node agent"
USER pai
EXPOSE 9186 9187
CMD ["pai-api"]
