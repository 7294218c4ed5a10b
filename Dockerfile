# pgkube image: one statically linked binary on a distroless base, no shell, no C library. The
# manager runs it (`pgkube run`). Instance pods and backup and restore Jobs run it in an init
# container, `pgkube instance install <path>`, which copies it into a volume that their main
# container, the cluster's PostgreSQL image, runs it from: `pgkube instance run` there, and
# `pgkube agent ...` with that image's pg_dump, pg_restore and psql. Being static, the same file
# runs in a PostgreSQL image of any C library (Debian, Alpine). docs/install.md#the-image.

# --- build ---------------------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# musl-gcc compiles the C code of aws-lc-rs (the one rustls crypto provider) and zstd against
# musl; the Rust target's musl is linked in whole.
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add "$(uname -m)-unknown-linux-musl"
COPY Cargo.toml Cargo.lock ./
COPY crds crds
COPY controllers controllers
COPY tests/support tests/support
COPY src src
COPY benches benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-musl" \
    && cargo build --release --locked --bin pgkube --target "$target" \
    && cp "target/$target/release/pgkube" /usr/local/bin/pgkube

# --- runtime -------------------------------------------------------------------------------
# CA certificates, time zones and the nonroot user, nothing else. Pinned by digest: a tag
# moves. Debian 12's distroless images are no longer updated; this is Debian 13's.
FROM gcr.io/distroless/static-debian13:nonroot@sha256:e2e927ec666bae08560abb3c55d0659eceabb657f56b6782ab500a9fc7f555e3
COPY --from=build /usr/local/bin/pgkube /usr/local/bin/pgkube
# The distroless "nonroot" uid, by number so that the kubelet can verify runAsNonRoot; the
# Deployment's securityContext matches it.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/pgkube"]
CMD ["run"]
