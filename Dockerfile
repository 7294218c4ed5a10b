# pgkube image: the manager (`pgkube run`), the backup/restore agent (`pgkube agent ...`), which
# needs the PostgreSQL client tools (pg_dump, pg_restore, psql) of a recent major, and the
# instance manager (`pgkube instance ...`), which an init container copies into PostgreSQL pods.

# --- build ---------------------------------------------------------------------------------
# Built on Debian 12: the binary also runs in the PostgreSQL pods, whose official images
# (postgres:13 to 17) are Debian 12 based, and a binary linked against Debian 13's newer glibc
# would not start there. It runs on newer systems as well, like this image's Debian 13.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# aws-lc-rs (the one rustls crypto provider) builds C code.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake clang pkg-config \
    && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY crds crds
COPY controllers controllers
COPY tests/support tests/support
COPY src src
COPY benches benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin pgkube \
    && cp target/release/pgkube /usr/local/bin/pgkube

# --- runtime -------------------------------------------------------------------------------
# Debian 13 ships PostgreSQL 17 client tools, which dump servers 9.2 to 17 and restore into 17.
FROM debian:trixie-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates postgresql-client-17 \
    && rm -rf /var/lib/apt/lists/* \
    && pg_dump --version
COPY --from=build /usr/local/bin/pgkube /usr/local/bin/pgkube
# The distroless "nonroot" uid, matching the Deployment's securityContext.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/pgkube"]
CMD ["run"]
