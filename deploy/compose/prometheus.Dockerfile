# Prometheus from Debian's prometheus package, for machines that reach no
# registry (this repository's CI). Real users take the upstream image
# (PROMETHEUS_IMAGE, prom/prometheus); this one has the same entry point,
# user (nobody) and data directory (/prometheus), so the compose file's
# command line serves both.
#   docker build -t pai-test/prometheus -f deploy/compose/prometheus.Dockerfile \
#       --build-arg BASE_IMAGE=pai-test/debian:bookworm deploy/compose
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN set -eu; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    mkdir -p /prometheus /etc/prometheus; \
    chown nobody:nogroup /prometheus
WORKDIR /prometheus
USER nobody
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
