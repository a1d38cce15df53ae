#!/usr/bin/env bash
# The whole test suite, from a fresh machine or a warm one:
#   1. builds (or reuses) the pinned control plane and tools, and moto's virtualenv;
#      installs Debian's PostgreSQL server when missing (cairn-instance's tests)
#      and the real nodes' packages (containerd, runc, CNI plugins, mmdebstrap, umoci);
#   2. lints: cargo fmt, cargo clippy -D warnings, cargo deny (licenses, bans,
#      sources), actionlint, helm lint, promtool (the alerts' checks and unit
#      tests), bash -n;
#   3. builds the images of the database pods and the controllers (hack/images.sh);
#   4. starts a fresh local cluster in a temporary folder, with real nodes that
#      get those images (stopped on exit, then checked for leftovers);
#   5. runs every Rust test of the workspace against it, in two lanes side by
#      side (hack/run-tests.sh), every test binary even after a failure, so
#      one run shows every failure.
# Arguments, if any, replace `--workspace` in the cargo test call, which then
# runs alone (no lanes):
#   hack/test.sh -p cairn-e2e --test smoke
# CAIRN_SKIP_LINT=1 skips step 2 (for a quick rerun of one test while other
# files are being edited; CI never sets it). The components' logs are kept in
# the cache's last-test-logs after a failure, and after any run with
# CAIRN_KEEP_LOGS=1 (hack/chaos.sh sets it).
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
  "$(hack/cargo-deny.sh)" --locked check licenses bans sources
  "$BIN/actionlint" .github/workflows/*.yml
  "$CAIRN_ROOT/hack/charts.sh" "$BIN/helm"
  "$BIN/helm" lint --strict --quiet charts/*/
  # The optional objects, rendered and linted too.
  "$BIN/helm" lint --strict --quiet charts/cairn-*-controller/ \
    --set grafanaDashboards.enabled=true,serviceMonitor.enabled=true,networkPolicy.enabled=true
  "$BIN/helm" lint --strict --quiet charts/cairn/ \
    --set database.grafanaDashboards.enabled=true,backup.grafanaDashboards.enabled=true,cloud.grafanaDashboards.enabled=true
  # The alerts: valid, their unit tests passing (e2e/tests/alerts.rs checks
  # that each alert has a firing and a silent test, and a runbook), and
  # rendered into each chart's PrometheusRule.
  local rules
  for rules in charts/*/rules/alerts.yaml; do
    "$BIN/promtool" check rules "$rules"
    "$BIN/promtool" test rules "${rules%.yaml}.test.yaml"
    "$BIN/helm" template "${rules%/rules/alerts.yaml}" --set prometheusRule.enabled=true >/dev/null
  done
  local script
  for script in hack/*.sh hack/tools/*.sh .ci/run; do bash -n "$script"; done
}

STATE=""
stop_cluster() {
  local status=$?
  [[ -n "$STATE" ]] || return 0
  if ((status != 0)) || [[ -n ${CAIRN_KEEP_LOGS:-} ]]; then
    local logs
    for logs in "$STATE/logs" "$STATE.failed-logs"; do
      [[ -d "$logs" ]] || continue
      rm -rf "$CAIRN_CACHE/last-test-logs"
      cp -r "$logs" "$CAIRN_CACHE/last-test-logs"
      if ((status != 0)); then
        log "failed: component logs kept in $CAIRN_CACHE/last-test-logs"
      else
        log "component logs kept in $CAIRN_CACHE/last-test-logs"
      fi
    done
  fi
  local pids
  pids=$(cut -d' ' -f1 "$STATE"/pids/*.pid 2>/dev/null || true)
  "$CAIRN_ROOT/hack/local-cluster.sh" down "$STATE"
  "$CAIRN_ROOT/hack/leftovers.sh" "$STATE"
  # Nothing of the cluster may outlive it: no process of a component's process
  # group, no process naming the state folder (zombies waiting for init to
  # reap them have exited and do not count).
  local pid survivors=()
  for pid in $pids $(pgrep -f -- "$STATE" || true); do
    for pid in $pid $(pgrep -g "$pid" || true); do
      proc_running "$pid" && survivors+=("$pid")
    done
  done
  if ((${#survivors[@]})); then
    ps -o pid,pgid,stat,args -p "${survivors[*]}" >&2 || true
    die "processes of the test cluster are still running after down"
  fi
  rm -rf "$(dirname "$STATE")"
}

start_cluster() {
  STATE=$(mktemp -d -t cairn-test.XXXXXX)/cluster
  trap 'stop_cluster; rm -f "$ARTIFACTS"' EXIT
  "$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
  "$CAIRN_ROOT/hack/local-cluster.sh" import-images "$STATE" "$IMAGES"/*.tar
  # KUBECONFIG and the rest point at the test cluster, for cargo test and any
  # kubectl or helm the tests run.
  # shellcheck disable=SC1091
  source "$STATE/env"
}

total_start=$SECONDS
build_tools() { BIN=$("$CAIRN_ROOT/hack/build-tools.sh"); }
step "tools" build_tools
step "moto virtualenv" "$CAIRN_ROOT/hack/moto-venv.sh" >/dev/null
postgres_server() { CAIRN_POSTGRES_BINDIR=$("$CAIRN_ROOT/hack/postgres.sh"); export CAIRN_POSTGRES_BINDIR; }
step "postgresql server" postgres_server
step "node packages" "$CAIRN_ROOT/hack/node-packages.sh"
if [[ "${CAIRN_SKIP_LINT:-}" == 1 ]]; then log "== lint skipped (CAIRN_SKIP_LINT=1)"; else step "lint" lint; fi
test_args=("$@")
((${#test_args[@]})) || test_args=(--workspace)
ARTIFACTS=$(mktemp -t cairn-test-artifacts.XXXXXX)
trap 'rm -f "$ARTIFACTS"' EXIT
build_tests() {
  cargo test --locked --no-run --message-format=json-render-diagnostics "${test_args[@]}" >"$ARTIFACTS"
}
step "build tests" build_tests
build_images() { IMAGES=$("$CAIRN_ROOT/hack/images.sh" workspace); }
step "images" build_images
step "local cluster up" start_cluster
# The charts' dependencies, built once: tests running side by side must not
# rebuild them under each other's helm.
build_charts() { "$CAIRN_ROOT/hack/charts.sh" "$BIN/helm"; export CAIRN_CHARTS_BUILT=1; }
step "chart dependencies" build_charts
if (($#)); then
  step "cargo test" cargo test --locked --no-fail-fast "${test_args[@]}"
else
  step "tests in lanes" "$CAIRN_ROOT/hack/run-tests.sh" "$ARTIFACTS"
fi
rm -f "$ARTIFACTS"
step "local cluster down" stop_cluster
trap - EXIT

log "== timings"
printf '  %s\n' "${timings[@]}" >&2
log "total $((SECONDS - total_start)) s"
