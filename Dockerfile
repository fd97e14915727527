# Sluice container image: a Rust builder stage, then a distroless runtime stage that
# holds the `sluice` binary only and runs as a non-root user. `/bin/ratelimit` links
# to it, so the image also stands in Envoy Gateway's rate limit Deployment, which
# runs `/bin/ratelimit` as uid 65534 on a read-only root filesystem with every
# capability dropped (sluice writes no file).
#
#   docker build -t sluice:dev .
#   docker run --rm -p 8080:8080 -p 8081:8081 \
#       -v "$PWD/examples/policy.yaml:/etc/sluice/policy.yaml:ro" sluice:dev
#
# Releases build it for linux/amd64 and linux/arm64 (.github/workflows/release.yml).
# Where no registry can be reached, scripts/image-test.sh builds the runtime stage
# from local layers (RUNTIME_BASE: a root made from Debian's packages; BINARY_FROM: a
# binary built outside) and runs it as Envoy Gateway runs its rate limit container.
# scripts/check-image.py holds the stubs below against the workspace's targets and
# the Rust version against the dependencies' `rust-version`.
# No `# syntax=` line: Docker's built-in frontend reads this file, so a build needs
# no frontend image from a registry.

ARG RUST_VERSION=1.89
# The runtime stage's base: glibc, libgcc, CA certificates, time zones, no shell.
ARG RUNTIME_BASE=gcr.io/distroless/cc-debian12:nonroot
# Where the runtime stage takes /out (the binary and /bin/ratelimit) from: the build
# stage, or an image holding that tree for a binary built outside.
ARG BINARY_FROM=build

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them. Cargo reads
# every target of the workspace's manifests, so each gets a stub here
# (scripts/check-image.py checks this list against `cargo metadata`).
COPY Cargo.toml Cargo.lock ./
COPY crates/sluice-bench/Cargo.toml crates/sluice-bench/
COPY crates/sluice-grpc/Cargo.toml crates/sluice-grpc/
COPY crates/sluice-redis/Cargo.toml crates/sluice-redis/
# build.rs compiles proto/ (protox, no protoc): copied with the manifests, so its
# build-time crates are cached with the others.
COPY build.rs ./
COPY proto proto/
RUN mkdir -p src benches crates/sluice-bench/src crates/sluice-grpc/src crates/sluice-redis/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs crates/sluice-grpc/src/lib.rs crates/sluice-redis/src/lib.rs \
    && echo 'fn main() {}' > benches/metrics.rs \
    && echo 'fn main() {}' > benches/request.rs \
    && echo 'fn main() {}' > benches/policy.rs \
    && echo 'fn main() {}' > crates/sluice-bench/src/main.rs \
    && cargo build --profile dist --locked -p sluice --bin sluice \
    && rm -rf src benches crates/sluice-bench/src crates/sluice-grpc/src crates/sluice-redis/src
# The sources, and any build-time data they embed (such as the CRD `sluice crd` prints).
COPY . .
# Touched so that Cargo rebuilds them over the stubs whatever the copied times.
RUN touch src/main.rs src/lib.rs crates/sluice-grpc/src/lib.rs crates/sluice-redis/src/lib.rs \
    && cargo build --profile dist --locked -p sluice --bin sluice \
    && mkdir -p /out/usr/local/bin /out/bin \
    && cp target/dist/sluice /out/usr/local/bin/sluice \
    && ln -s /usr/local/bin/sluice /out/bin/ratelimit

FROM ${BINARY_FROM} AS binary

# glibc + libgcc, no shell, no package manager. uid/gid 65534 ("nobody"), as Envoy
# Gateway runs its rate limit container.
FROM ${RUNTIME_BASE} AS runtime
# The binary and the link, as laid out in /out (a copied tree keeps its links).
COPY --from=binary /out/ /
USER 65534:65534
# 8081: RateLimitService (gRPC); 8080: /healthz, /readyz, /healthcheck, /metrics,
# /json, /debug/*.
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice"]
