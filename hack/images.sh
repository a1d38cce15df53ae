#!/usr/bin/env bash
# Container images without a registry: root filesystems assembled from Debian's
# packages (mmdebstrap), the workspace's release binaries added as a layer of
# their own, packed as OCI archives (umoci) for `ctr images import`.
#
#   hack/images.sh node        the images the cluster itself needs (pod sandbox
#                              pause, the volume helper); prints their folder
#   hack/images.sh workspace   cairn-instance's database image and the database,
#                              backup and cloud controllers' images; prints
#                              their folder
#   hack/images.sh bases       only the Debian bases (the test command makes
#                              them in the background while Rust builds)
#
# The binaries in the workspace images:
#   - by default, the debug build's (the profile the tests are built with),
#     stripped of their line tables: one build of each binary serves both the
#     tests and the pods, where optimised release binaries (fat LTO) took
#     minutes of their own on every change. With CAIRN_IMAGE_ARTIFACTS naming
#     the JSON messages of `cargo test --no-run --message-format=json` (the
#     test command's), the executables that build made; without it, a
#     `cargo build` of the four binaries;
#   - with CAIRN_IMAGE_PROFILE=release, optimised release builds (what users
#     run: hack/bench.sh measures memory and time with these).
#
# Bases are cached by their recipe, images by base and binary, so a changed
# binary costs one layer (seconds). The images keep what the Dockerfiles say
# (user, entrypoint, binary path); `check_like_dockerfile` fails the build when
# they drift apart.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

IMAGES=$CAIRN_CACHE/images
SUITE=bookworm
POSTGRES_MAJOR=15 # Debian 12's
PATH_IN_IMAGES=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Names the charts and the database controller use by default, so nothing is
# pulled: every node has them already (imagePullPolicy IfNotPresent or Never).
INSTANCE_IMAGE=ghcr.io/cairn-dev/postgres:$POSTGRES_MAJOR

hash_of() { sha256sum | cut -c1-16; }

# base NAME MMDEBSTRAP_ARGS...: a root filesystem as a layer archive, cached by
# the arguments that make it. Prints its path.
base() {
  local name=$1; shift
  local out
  out=$IMAGES/bases/$name-$(printf '%s\n' "$@" | hash_of).tar
  if [[ ! -s $out ]]; then
    mkdir -p "$(dirname "$out")"
    log "assembling the $name base from Debian packages (about a minute)"
    mmdebstrap --quiet --format=tar "$@" "$SUITE" "$out.partial" >&2
    mv "$out.partial" "$out"
  fi
  echo "$out"
}

# unpacked NAME PACKAGE... -- SCRIPT: Debian packages unpacked without their
# maintainer scripts (what distroless images are made of), then SCRIPT run
# with the root folder as $1; a layer archive cached by the recipe. Prints its path.
unpacked() {
  local name=$1; shift
  local packages=()
  while [[ $1 != -- ]]; do packages+=("$1"); shift; done
  local script=$2 out work deb
  out=$IMAGES/bases/$name-$(printf '%s\n' "${packages[@]}" "$script" | hash_of).tar
  if [[ ! -s $out ]]; then
    mkdir -p "$IMAGES/bases"
    work=$(mktemp -d "$IMAGES/bases/.unpack.XXXXXX")
    (cd "$work" && { apt-get download -qq "${packages[@]}" >&2 || { apt-get update -qq >&2 && apt-get download -qq "${packages[@]}" >&2; }; })
    mkdir "$work/root"
    for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
    bash -c "set -e; $script" _ "$work/root"
    tar -C "$work/root" --numeric-owner --owner=0 --group=0 -cf "$out.partial" .
    mv "$out.partial" "$out"
    rm -rf "$work"
  fi
  echo "$out"
}

# image REPOSITORY:TAG CONFIG_ARGS -- LAYER_TAR [FILE=TARGET...]: an OCI
# archive with one base layer and files added on top; cached by all of it.
# Writes IMAGES/<set>/<slug>.tar and .name (the repository, for ctr's base name).
image() {
  local set=$1 reference=$2; shift 2
  local config=()
  while [[ $1 != -- ]]; do config+=("$1"); shift; done
  shift
  local layer=$1; shift
  local key slug out work file
  key=$( { echo "$reference" "${config[@]}"; stat -c '%n %s %Y' "$layer"; for file in "$@"; do sha256sum "${file%%=*}"; echo "${file#*=}"; done; } | hash_of)
  slug=$(echo "${reference%%:*}" | tr '/' '_')
  out=$IMAGES/$set/$slug.tar
  if [[ -s $out && $(cat "$out.key" 2>/dev/null) == "$key" ]]; then return 0; fi
  mkdir -p "$IMAGES/$set"
  work=$(mktemp -d "$IMAGES/$set/.build.XXXXXX")
  local layout=$work/layout:${reference##*:}
  umoci init --layout "$work/layout"
  umoci new --image "$layout"
  umoci raw add-layer --image "$layout" "$layer"
  for file in "$@"; do umoci insert --image "$layout" "$(realpath "${file%%=*}")" "${file#*=}"; done
  umoci config --image "$layout" --config.env "PATH=$PATH_IN_IMAGES" "${config[@]}"
  umoci gc --layout "$work/layout"
  tar -C "$work/layout" -cf "$out.partial" .
  mv "$out.partial" "$out"
  echo "${reference%%:*}" >"$IMAGES/$set/$slug.name"
  echo "$key" >"$out.key"
  rm -rf "$work"
}

# The Dockerfile's USER and ENTRYPOINT must be what the image has.
check_like_dockerfile() { # dockerfile archive
  local dockerfile=$1 archive=$2 config user entrypoint
  config=$(python3 - "$archive" <<'PY'
import json, sys, tarfile
t = tarfile.open(sys.argv[1])
blob = lambda d: json.load(t.extractfile("./blobs/" + d.replace(":", "/")))
index = json.load(t.extractfile("./index.json"))
manifest = blob(index["manifests"][0]["digest"])
c = blob(manifest["config"]["digest"])["config"]
print(c.get("User", ""), json.dumps(c.get("Entrypoint", []), separators=(", ", ":")))
PY
)
  user=$(awk '$1 == "USER" {print $2}' "$dockerfile" | tail -1)
  entrypoint=$(awk '$1 == "ENTRYPOINT" {$1 = ""; sub(/^ /, ""); print}' "$dockerfile" | tail -1)
  [[ $config == "$user $entrypoint" ]] ||
    die "$archive differs from $dockerfile: image has '$config', the Dockerfile says '$user $entrypoint'"
}

node_images() {
  # The pause binary, alone in its image, as Kubernetes builds it.
  local pause busybox
  pause=$(bin_dir)/pause
  local empty
  empty=$IMAGES/bases/empty.tar
  [[ -s $empty ]] || { mkdir -p "$IMAGES/bases"; tar -cf "$empty" -T /dev/null; }
  image node "$PAUSE_IMAGE" --config.user 65535:65535 --config.entrypoint /pause -- "$empty" "$pause=/pause"
  # Busybox from Debian's static build: the volume provisioner's helper.
  busybox=$(unpacked busybox busybox-static -- \
    'for a in $("$1/bin/busybox" --list); do [ -e "$1/bin/$a" ] || ln -s busybox "$1/bin/$a"; done')
  image node "$HELPER_IMAGE" --config.entrypoint /bin/sh -- "$busybox"
  echo "$IMAGES/node"
}

RELEASE_BINARIES=(cairn-instance cairn-database-controller cairn-backup-controller cairn-cloud-controller)

# What makes the release binaries: the toolchain and linker, the build
# settings in the environment, the workspace manifest and lock file, and every
# file of the workspace packages they are built from (their tests, benches
# and examples left out) with each one's build script.
release_inputs() {
  rustc -vV
  cargo -V
  ld --version | head -n 1
  env | grep -E '^(RUSTFLAGS|RUSTC|CARGO_ENCODED_RUSTFLAGS|CARGO_BUILD_|CARGO_PROFILE_|CAIRN_GIT_COMMIT)' | sort || true
  cd "$CAIRN_ROOT"
  cargo metadata --format-version 1 --locked | python3 -c '
import json, os, sys
wanted, root = sys.argv[1:], os.getcwd()
meta = json.load(sys.stdin)
members = {p["id"]: p for p in meta["packages"] if p["id"] in meta["workspace_members"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
todo = [i for i, p in members.items() if p["name"] in wanted]
seen = set()
while todo:
    package = todo.pop()
    if package in seen:
        continue
    seen.add(package)
    for dep in nodes[package]["deps"]:
        kinds = {k["kind"] for k in dep["dep_kinds"]}
        if dep["pkg"] in members and kinds - {"dev"}:
            todo.append(dep["pkg"])
paths = {"Cargo.toml", "Cargo.lock", ".cargo/config.toml"}
for package in seen:
    paths.add(os.path.relpath(os.path.dirname(members[package]["manifest_path"]), root))
    for target in members[package]["targets"]:
        if "custom-build" in target["kind"]:
            paths.add(os.path.relpath(target["src_path"], root))
print("\n".join(sorted(paths)))
' "${RELEASE_BINARIES[@]}" |
    xargs git ls-files --cached --others --exclude-standard -- |
    grep -Ev '/(tests|benches|examples)/' | sort -u |
    while IFS= read -r file; do [[ ! -f $file ]] || sha256sum "$file"; done
}

# The release binaries, cached by a hash of release_inputs: a fresh clone
# would otherwise relink all four with fat LTO (minutes), as cargo's
# fingerprints hold the clone's path. The newest three builds are kept.
# Prints their folder.
release_binaries() {
  local key out binary
  key=$(release_inputs | hash_of)
  out=$IMAGES/release/$key
  if [[ ! -d $out ]]; then
    log "building the release binaries for the images"
    cargo build --release --locked --quiet "${RELEASE_BINARIES[@]/#/--package=}"
    rm -rf "$out.partial" && mkdir -p "$out.partial"
    for binary in "${RELEASE_BINARIES[@]}"; do cp "$CARGO_TARGET_DIR/release/$binary" "$out.partial/"; done
    mv "$out.partial" "$out"
    # shellcheck disable=SC2012 # plain folder names
    ls -1dt "$IMAGES"/release/*/ | tail -n +4 | xargs -r rm -rf
  else
    log "release binaries unchanged since their last build, reused"
  fi
  touch "$out"
  echo "$out"
}

# The debug build's binaries, stripped of their line tables, in a folder
# cached by their contents. Prints the folder.
debug_binaries() {
  local binary executables=()
  if [[ -n ${CAIRN_IMAGE_ARTIFACTS:-} ]]; then
    mapfile -t executables < <("$CAIRN_ROOT/hack/artifacts.py" bins "$CAIRN_IMAGE_ARTIFACTS" "${RELEASE_BINARIES[@]}")
  else
    cargo build --locked --quiet "${RELEASE_BINARIES[@]/#/--package=}"
    for binary in "${RELEASE_BINARIES[@]}"; do executables+=("$CARGO_TARGET_DIR/debug/$binary"); done
  fi
  local key out i
  key=$(sha256sum "${executables[@]}" | hash_of)
  out=$IMAGES/debug/$key
  if [[ ! -d $out ]]; then
    rm -rf "$out.partial" && mkdir -p "$out.partial"
    for i in "${!RELEASE_BINARIES[@]}"; do
      objcopy --strip-debug "${executables[$i]}" "$out.partial/${RELEASE_BINARIES[$i]}"
    done
    mv "$out.partial" "$out"
    # shellcheck disable=SC2012 # plain folder names
    ls -1dt "$IMAGES"/debug/*/ | tail -n +4 | xargs -r rm -rf
  fi
  touch "$out"
  echo "$out"
}

# The bases of the workspace images (Debian packages), made or reused.
POSTGRES_PACKAGES=(--variant=minbase --skip=output/dev --include="postgresql-$POSTGRES_MAJOR,ca-certificates"
  '--essential-hook=echo "postgres:x:999:999:PostgreSQL administrator:/var/lib/postgresql:/bin/bash" >>"$1/etc/passwd" && echo "postgres:x:999:" >>"$1/etc/group" && echo "postgres:*:20000:0:99999:7:::" >>"$1/etc/shadow"'
  '--essential-hook=mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" >"$1/etc/postgresql-common/createcluster.d/cairn.conf"'
  "--customize-hook=rm -rf \"\$1\"/usr/lib/postgresql/$POSTGRES_MAJOR/lib/llvmjit* \"\$1\"/usr/lib/postgresql/$POSTGRES_MAJOR/lib/bitcode \"\$1\"/usr/lib/x86_64-linux-gnu/libLLVM* \"\$1\"/usr/share/doc \"\$1\"/usr/share/man \"\$1\"/usr/share/locale \"\$1\"/var/cache/apt \"\$1\"/var/lib/apt/lists")
postgres_base() { base postgres "${POSTGRES_PACKAGES[@]}"; }
controller_base() {
  # Like distroless/cc: glibc, libgcc, CA certificates, time zones, and the
  # nonroot user 65532; no shell, no package manager.
  unpacked controller libc6 libgcc-s1 ca-certificates tzdata netbase base-files -- '
    cat "$1"/usr/share/ca-certificates/mozilla/*.crt >"$1/etc/ssl/certs/ca-certificates.crt"
    printf "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n" >"$1/etc/passwd"
    printf "root:x:0:\nnonroot:x:65532:\n" >"$1/etc/group"
    mkdir -p "$1/tmp" "$1/home/nonroot" && chmod 1777 "$1/tmp" && chown 65532:65532 "$1/home/nonroot"
    rm -rf "$1/usr/share/doc" "$1/usr/share/man" "$1/usr/share/locale"'
}
bases() { postgres_base; controller_base; }

workspace_images() {
  local release version
  case ${CAIRN_IMAGE_PROFILE:-debug} in
    release) release=$(release_binaries) ;;
    debug) release=$(debug_binaries) ;;
    *) die "CAIRN_IMAGE_PROFILE is debug or release, not $CAIRN_IMAGE_PROFILE" ;;
  esac
  version=$(cargo metadata --no-deps --format-version 1 --locked |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cairn-database-controller"))')

  # Like the official postgres image: user postgres is 999:999, PostgreSQL's
  # programs on PATH. LLVM (JIT, 130 MB) is left out; PostgreSQL runs without it.
  local postgres
  postgres=$(postgres_base)
  image workspace "$INSTANCE_IMAGE" --config.user 999:999 \
    --config.entrypoint /usr/local/bin/cairn-instance \
    --config.env "PATH=/usr/lib/postgresql/$POSTGRES_MAJOR/bin:$PATH_IN_IMAGES" -- \
    "$postgres" "$release/cairn-instance=/usr/local/bin/cairn-instance"
  check_like_dockerfile "$CAIRN_ROOT/controllers/instance/Dockerfile" "$IMAGES/workspace/$(echo "${INSTANCE_IMAGE%%:*}" | tr '/' '_').tar"

  local runtime
  runtime=$(controller_base)
  local binary
  for binary in cairn-database-controller cairn-backup-controller cairn-cloud-controller; do
    image workspace "ghcr.io/cairn-dev/$binary:$version" --config.user 65532:65532 --config.entrypoint /controller -- \
      "$runtime" "$release/$binary=/controller"
    check_like_dockerfile "$CAIRN_ROOT/Dockerfile" "$IMAGES/workspace/ghcr.io_cairn-dev_$binary.tar"
  done
  echo "$IMAGES/workspace"
}

case ${1:-} in
  node) node_images ;;
  workspace) workspace_images ;;
  bases) bases ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
