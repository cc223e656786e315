# Redis from Debian's redis-server, for machines that reach no registry (this
# repository's CI). Real users take the upstream image (REDIS_IMAGE, redis:7.4);
# both run the same `redis-server ...` command line from docker-compose.yml.
#   docker build -t pai-test/redis -f deploy/compose/redis.Dockerfile \
#       --build-arg BASE_IMAGE=pai-test/debian:bookworm deploy/compose
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN set -eu; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    mkdir -p /data; \
    chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server", "--appendonly", "yes", "--dir", "/data", "--protected-mode", "no"]
