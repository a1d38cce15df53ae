#!/usr/bin/env bash
# The whole test suite, from a fresh machine or a warm one:
#   1. builds (or reuses) the pinned control plane and tools, and moto's virtualenv;
#   2. lints: cargo fmt, cargo clippy -D warnings, actionlint, bash -n on hack/;
#   3. starts a fresh local cluster in a temporary folder (stopped on exit);
#   4. runs every Rust test of the workspace against it (cargo test).
# Extra arguments go to cargo test, e.g. `hack/test.sh -p cairn-e2e --test smoke`.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$CAIRN_ROOT"

timings=()
step() { # name command...
  local name=$1 start=$SECONDS; shift
  log "== $name"
  "$@"
  timings+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
}

lint() {
  cargo fmt --all -- --check
  cargo clippy --workspace --all-targets --locked -- -D warnings
  "$BIN/actionlint" .github/workflows/*.yml
  local script
  for script in hack/*.sh hack/tools/*.sh .ci/run; do bash -n "$script"; done
}

STATE=""
stop_cluster() {
  local status=$?
  [[ -n "$STATE" ]] || return 0
  if ((status != 0)); then
    rm -rf "$CAIRN_CACHE/last-test-logs"
    cp -r "$STATE/logs" "$CAIRN_CACHE/last-test-logs" 2>/dev/null &&
      log "tests failed: component logs kept in $CAIRN_CACHE/last-test-logs"
  fi
  "$CAIRN_ROOT/hack/local-cluster.sh" down "$STATE"
  # Nothing of the cluster may outlive it.
  if pgrep -f -- "$STATE" >/dev/null; then
    pgrep -af -- "$STATE" >&2
    die "processes of the test cluster are still running after down"
  fi
  rm -rf "$(dirname "$STATE")"
}

start_cluster() {
  STATE=$(mktemp -d -t cairn-test.XXXXXX)/cluster
  trap stop_cluster EXIT
  "$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
  export CAIRN_CLUSTER_STATE=$STATE
}

total_start=$SECONDS
build_tools() { BIN=$("$CAIRN_ROOT/hack/build-tools.sh"); }
step "tools" build_tools
step "moto virtualenv" "$CAIRN_ROOT/hack/moto-venv.sh" >/dev/null
step "lint" lint
step "build tests" cargo test --workspace --locked --no-run
step "local cluster up" start_cluster
step "cargo test" cargo test --workspace --locked "$@"
step "local cluster down" stop_cluster
trap - EXIT

log "== timings"
printf '  %s\n' "${timings[@]}" >&2
log "total $((SECONDS - total_start)) s"
