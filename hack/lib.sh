# Shared settings for hack/ scripts. Source it; do not run it.
# shellcheck shell=bash

CAIRN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Everything built or downloaded lives outside the repository, keyed by version.
CAIRN_CACHE=${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}
export CAIRN_ROOT CAIRN_CACHE
# Rust build output is shared across clones of the repository.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$CAIRN_CACHE/cargo-target}
# Incremental compilation keeps gigabytes per build of each test binary; CI
# builds from clean clones, where it saves little.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

log() { printf '\033[1;34m[cairn]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[cairn] error:\033[0m %s\n' "$*" >&2; exit 1; }

# Fields of /proc/PID/stat after the command name (which may hold spaces):
# the state is the 1st, the start time (in clock ticks since boot) the 20th.
proc_stat() { [[ -r /proc/$1/stat ]] && sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null; }
# Whether PID runs: a zombie (exited, not yet reaped) does not.
proc_running() { local stat; stat=$(proc_stat "$1") && [[ ${stat%% *} != Z ]]; }

# Version of a tool as pinned in its tools module (hack/tools/<component>/go.mod).
# A require block's line names the module first, a lone require second.
pinned_version() { # component module-path
  awk -v m="$2" '$1 == "require" {$1 = ""; $0 = $0} $1 == m && $2 ~ /^v/ {print $2; exit}' \
    "$CAIRN_ROOT/hack/tools/$1/go.mod"
}

# A component's optional Go build tags, one line (hack/tools/<component>/build-tags).
tool_build_tags() { # component
  local file=$CAIRN_ROOT/hack/tools/$1/build-tags
  [[ ! -f "$file" ]] || cat "$file"
}

# What decides a component's build: its pins, its build tags and the main
# package of a custom build (CoreDNS with only the plugins the cluster uses).
tool_inputs() { # component...
  local component dir
  for component in "$@"; do
    dir=$CAIRN_ROOT/hack/tools/$component
    cat "$dir/go.mod" "$dir/go.sum"
    tool_build_tags "$component"
    if compgen -G "$dir/*.go" >/dev/null; then cat "$dir"/*.go; fi
  done
}

# The cache folder of a component: its version plus a hash of its build
# inputs, so a change of any pin or tag builds into a new folder.
tool_dir() { # component module-path
  local version hash
  version=$(pinned_version "$1" "$2")
  hash=$(tool_inputs "$1" | sha256sum | cut -c1-12)
  echo "$CAIRN_CACHE/tools/$1-$version-$hash"
}

# The folder of links to the binaries of the current pins and tags: one per
# set of them, so clones at different pins never repoint each other's.
bin_dir() {
  local components
  components=$(cd "$CAIRN_ROOT/hack/tools" && for dir in */; do echo "${dir%/}"; done)
  # shellcheck disable=SC2086 # one word per component
  echo "$CAIRN_CACHE/bin-$(tool_inputs $components | sha256sum | cut -c1-12)"
}

KUBERNETES_VERSION=$(pinned_version kubernetes k8s.io/kubernetes)
export KUBERNETES_VERSION

# Images of the real nodes themselves (hack/images.sh builds them; never pulled).
PAUSE_IMAGE=cairn.local/pause:$KUBERNETES_VERSION
HELPER_IMAGE=cairn.local/busybox:1
