# syntax=docker/dockerfile:1
# The image of one controller binary: static glibc-linked Rust on distroless,
# non-root, nothing else in it.
#
#   docker build --build-arg BINARY=cairn-database-controller \
#     --build-arg GIT_COMMIT="$(git rev-parse HEAD)" -t cairn-database-controller .
FROM docker.io/library/rust:1.95-bookworm AS build
ARG BINARY
ARG GIT_COMMIT=unknown
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    test -n "$BINARY" \
    && CAIRN_GIT_COMMIT="$GIT_COMMIT" cargo build --release --locked --bin "$BINARY" \
    && cp "target/release/$BINARY" /controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /controller /controller
# The chart runs it as this user with a read-only root filesystem.
USER 65532:65532
ENTRYPOINT ["/controller"]
