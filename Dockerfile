# syntax=docker/dockerfile:1
#
# Sluice container image: a Rust builder stage, then a distroless final stage that
# holds the `sluice` binary only and runs as a non-root user.
#
#   docker build -t sluice:dev .
#   docker run --rm -p 8080:8080 -p 8081:8081 -v "$PWD/examples:/etc/sluice:ro" \
#       sluice:dev serve --config /etc/sluice
#
# (This file was not built in the environment where it was written: it has no
# container engine. tests/e2e/kind.sh builds it.)

ARG RUST_VERSION=1.88

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin \
    && echo 'fn main() {}' > src/main.rs \
    && echo 'fn main() {}' > src/bin/sluice-bench.rs \
    && touch src/lib.rs \
    && cargo build --release --locked --bin sluice \
    && rm -rf src
# The sources, and any build-time data they embed (such as the CRD `sluice crd` prints).
COPY . .
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin sluice \
    && cp target/release/sluice /sluice

# glibc + libgcc, no shell, no package manager; uid/gid 65532 ("nonroot").
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /sluice /usr/local/bin/sluice
USER 65532:65532
# 8081: RateLimitService (gRPC); 8080: /healthz, /readyz, /metrics, /json, /debug/*.
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice"]
