#!/usr/bin/env bash
# Container images without a registry: root filesystems assembled from Debian's
# packages (mmdebstrap), the workspace's release binaries added as a layer of
# their own, packed as OCI archives (umoci) for `ctr images import`.
#
#   hack/images.sh node        the images the cluster itself needs (pod sandbox
#                              pause, the volume helper); prints their folder
#   hack/images.sh workspace   cairn-instance's database image and the database,
#                              backup and cloud controllers' images, from
#                              release builds; prints their folder
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

workspace_images() {
  log "building the release binaries for the images"
  cargo build --release --locked --quiet -p cairn-instance -p cairn-database-controller -p cairn-backup-controller -p cairn-cloud-controller
  local release=$CARGO_TARGET_DIR/release version
  version=$(cargo metadata --no-deps --format-version 1 --locked |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cairn-database-controller"))')

  # Like the official postgres image: user postgres is 999:999, PostgreSQL's
  # programs on PATH. LLVM (JIT, 130 MB) is left out; PostgreSQL runs without it.
  local postgres
  postgres=$(base postgres --variant=minbase --skip=output/dev --include="postgresql-$POSTGRES_MAJOR,ca-certificates" \
    '--essential-hook=echo "postgres:x:999:999:PostgreSQL administrator:/var/lib/postgresql:/bin/bash" >>"$1/etc/passwd" && echo "postgres:x:999:" >>"$1/etc/group" && echo "postgres:*:20000:0:99999:7:::" >>"$1/etc/shadow"' \
    '--essential-hook=mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" >"$1/etc/postgresql-common/createcluster.d/cairn.conf"' \
    "--customize-hook=rm -rf \"\$1\"/usr/lib/postgresql/$POSTGRES_MAJOR/lib/llvmjit* \"\$1\"/usr/lib/postgresql/$POSTGRES_MAJOR/lib/bitcode \"\$1\"/usr/lib/x86_64-linux-gnu/libLLVM* \"\$1\"/usr/share/doc \"\$1\"/usr/share/man \"\$1\"/usr/share/locale \"\$1\"/var/cache/apt \"\$1\"/var/lib/apt/lists")
  image workspace "$INSTANCE_IMAGE" --config.user 999:999 \
    --config.entrypoint /usr/local/bin/cairn-instance \
    --config.env "PATH=/usr/lib/postgresql/$POSTGRES_MAJOR/bin:$PATH_IN_IMAGES" -- \
    "$postgres" "$release/cairn-instance=/usr/local/bin/cairn-instance"
  check_like_dockerfile "$CAIRN_ROOT/controllers/instance/Dockerfile" "$IMAGES/workspace/$(echo "${INSTANCE_IMAGE%%:*}" | tr '/' '_').tar"

  # Like distroless/cc: glibc, libgcc, CA certificates, time zones, and the
  # nonroot user 65532; no shell, no package manager.
  local runtime
  runtime=$(unpacked controller libc6 libgcc-s1 ca-certificates tzdata netbase base-files -- '
    cat "$1"/usr/share/ca-certificates/mozilla/*.crt >"$1/etc/ssl/certs/ca-certificates.crt"
    printf "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n" >"$1/etc/passwd"
    printf "root:x:0:\nnonroot:x:65532:\n" >"$1/etc/group"
    mkdir -p "$1/tmp" "$1/home/nonroot" && chmod 1777 "$1/tmp" && chown 65532:65532 "$1/home/nonroot"
    rm -rf "$1/usr/share/doc" "$1/usr/share/man" "$1/usr/share/locale"')
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
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
