# herald in a container: a Rust builder stage, a Debian slim runtime as a non-root user.
#
#   docker build -t herald .
#   echo "HERALD_TOKEN=$(openssl rand -hex 24)" > herald.env && chmod 600 herald.env   # keep it
#   docker run -d --name herald -p 7700:7700 -v herald-data:/var/lib/herald \
#     --env-file herald.env -v "$PWD/herald.toml:/etc/herald/herald.toml:ro" \
#     --stop-timeout 40 herald serve --config /etc/herald/herald.toml
#
# (README, "Running it in production", has the whole recipe.) The variables below are
# defaults: a mounted config file that sets the same key wins, so leave `listen` and
# `data_dir` out of it (or keep them as below) for the port mapping and the volume to apply.
#
# Stopping: `docker stop` sends SIGTERM (STOPSIGNAL below); herald then drains, waiting up to
# its shutdown_timeout (HERALD_SHUTDOWN_TIMEOUT, 30s here) for sends in flight. Docker kills
# the container 10 s after SIGTERM unless told otherwise, so give it a grace period above the
# drain: `docker run --stop-timeout 40`, `docker stop -t 40`, or in compose
# `stop_grace_period: 40s`. (A kill is still safe, only not graceful: a send cut off goes again
# after the restart with the same idempotency key.)

FROM rust:1.95-trixie AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin herald

FROM debian:trixie-slim
# ca-certificates: the system CA store, for channels whose `ca_file` points into it (herald
# carries Mozilla's roots itself); curl: the HEALTHCHECK.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/herald --shell /usr/sbin/nologin herald \
 && mkdir -p /var/lib/herald /etc/herald \
 && chown herald:herald /var/lib/herald
COPY --from=build /src/target/release/herald /usr/local/bin/herald
USER herald
WORKDIR /var/lib/herald
# Every config key has a HERALD_* variable (README, "Environment variables"); a variable fills
# only a key the config file (mounted at /etc/herald/herald.toml, passed with `serve --config`)
# does not set. Listening on 0.0.0.0 needs a token (HERALD_TOKEN, 16 characters or more).
ENV HERALD_LISTEN=0.0.0.0:7700 \
    HERALD_DATA_DIR=/var/lib/herald \
    HERALD_SHUTDOWN_TIMEOUT=30s
VOLUME ["/var/lib/herald"]
EXPOSE 7700
# 503 while recovering, draining or while storage fails.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:7700/healthz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["herald"]
CMD ["serve"]
