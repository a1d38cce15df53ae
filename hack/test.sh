#!/usr/bin/env bash
# The whole test suite, from a fresh machine or a warm one, in two tiers:
#
#   preparation, in the background from the start (niced, so the tiers in the
#   foreground keep the cores): the pinned control plane and tools
#   (hack/build-tools.sh), cargo-deny (once tier 1's cargo runs are done:
#   it takes cargo's package cache lock), Debian's PostgreSQL server and the
#   real nodes' packages, the images' Debian bases, moto's virtualenv;
#
#   tier 1, no cluster (fails fast, before anything is built for the cluster):
#     cargo fmt, cargo clippy -D warnings, the test build, the unit and
#     fake-API tests and the other binaries that need no cluster
#     (hack/run-tests.sh unit), the doc tests; then, once the tools are
#     there, cargo deny (licenses, bans, sources), actionlint, helm lint,
#     promtool (the alerts' checks and unit tests), bash -n;
#
#   tier 2, the cluster: the images of the database pods and the controllers,
#     made from the test build's own binaries (hack/images.sh); a fresh local
#     cluster in a temporary folder with real nodes that get those images
#     (stopped on exit, then checked for leftovers); every other test binary
#     against it, in lanes (hack/run-tests.sh cluster), every binary even
#     after a failure, so one run shows every failure.
#
# At the end: each step's time against its share of the budget (60 minutes on
# a new machine, 20 warm), a warning for each step over its share, and the
# slowest test binaries.
#
# Arguments, if any, replace `--workspace` in one `cargo test` call, which then
# runs alone after tier 1's lint (no lanes, no unit tier):
#   hack/test.sh -p cairn-e2e --test smoke
# CAIRN_SKIP_LINT=1 skips the lint steps (for a quick rerun of one test while
# other files are being edited; CI never sets it). The components' logs are
# kept in the cache's last-test-logs after a failure, and after any run with
# CAIRN_KEEP_LOGS=1 (hack/chaos.sh sets it).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$CAIRN_ROOT"

# The budget (seconds) and each step's share of it, warm and cold. A cold run
# builds the control plane and every crate; a warm one finds them in the
# cache (a fresh clone still rebuilds the workspace's own crates).
BUDGET_WARM=1200
BUDGET_COLD=3600
declare -A SHARE_WARM=(
  [lint: rust]=60 [build tests]=90 [unit tier]=25 [doc tests]=25 [lint: charts, workflows, deny]=25
  [wait: tools]=10 [wait: cargo-deny]=5 [wait: packages and bases]=10 [wait: moto virtualenv]=5
  [images]=20 [local cluster up]=45 [chart dependencies]=10 [cluster tier]=840 [local cluster down]=30
)
declare -A SHARE_COLD=(
  [lint: rust]=480 [build tests]=700 [unit tier]=60 [doc tests]=90 [lint: charts, workflows, deny]=45
  [wait: tools]=800 [wait: cargo-deny]=60 [wait: packages and bases]=30 [wait: moto virtualenv]=15
  [images]=60 [local cluster up]=60 [chart dependencies]=15 [cluster tier]=1060 [local cluster down]=25
)

timings=()   # "name<TAB>seconds"
step() { # name command...
  # The command's status is returned, not only acted on by `set -e`: a call
  # as `step ... || status=$?` runs with errexit off, where a plain "$@"
  # followed by the timing would report success for a failed step.
  local name=$1 start=$SECONDS status=0; shift
  log "== $name"
  "$@" || status=$?
  timings+=("$name"$'\t'"$((SECONDS - start))")
  return "$status"
}

# Background preparation: each job in a process group of its own (killed if
# the run ends first), its output in a log, its status and time in files.
PREP=$(mktemp -d -t cairn-prep.XXXXXX)
declare -A JOBS=()
background() { # name command...
  local name=$1; shift
  setsid bash -c '
    start=$SECONDS
    status=0
    nice -n 10 "${@:3}" >"$1/$2.out" 2>"$1/$2.log" || status=$?
    echo "$status $((SECONDS - start))" >"$1/$2.status"' _ "$PREP" "$name" "$@" &
  JOBS[$name]=$!
}
# await NAME: waits for a background job; fails the run with its log if it failed.
await() {
  local name=$1 status seconds
  wait "${JOBS[$name]}" 2>/dev/null || true
  unset "JOBS[$name]"
  read -r status seconds <"$PREP/$name.status" || die "background job $name left no status"
  timings+=("$name (background)"$'\t'"$seconds")
  if ((status != 0)); then
    tail -n 60 "$PREP/$name.log" >&2
    die "background job $name failed (exit $status)"
  fi
}
stop_background() {
  local pid
  for pid in "${JOBS[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  rm -rf "$PREP"
}

lint_rust() {
  cargo fmt --all -- --check
  cargo clippy --workspace --all-targets --locked -- -D warnings
  untested_doc_examples
}

# A crate with `doctest = false` (rustdoc took about 5 s a crate to find no
# example) must have no Rust code block in its documentation (an opening
# fence with no language, or rust, no_run, ignore, should_panic,
# compile_fail): it would never be compiled.
untested_doc_examples() {
  local manifest found=0
  for manifest in */Cargo.toml */*/Cargo.toml; do
    grep -q '^doctest = false' "$manifest" || continue
    find "$(dirname "$manifest")/src" -name '*.rs' -print0 | xargs -0 awk '
      FNR == 1 { open = 0 }
      /^[[:space:]]*\/\/[\/!][[:space:]]*```/ {
        info = $0; sub(/^[[:space:]]*\/\/[\/!][[:space:]]*```/, "", info)
        if (!open && (info ~ /^[[:space:]]*$/ || info ~ /rust|no_run|ignore|should_panic|compile_fail|edition/)) {
          print FILENAME ":" FNR ": a doc example in a crate that sets doctest = false"; bad = 1
        }
        open = !open
      }
      END { exit bad }' || found=1
  done
  return "$found"
}

lint_rest() {
  "$(cat "$PREP/cargo-deny.out")" --locked check licenses bans sources
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
stop_cluster() { # [exit status of the run]
  local status=${1:-$?}
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
  STATE=""
}

start_cluster() {
  STATE=$(mktemp -d -t cairn-test.XXXXXX)/cluster
  "$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
  "$CAIRN_ROOT/hack/local-cluster.sh" import-images "$STATE" "$IMAGES"/*.tar
  # KUBECONFIG and the rest point at the test cluster, for cargo test and any
  # kubectl or helm the tests run.
  # shellcheck disable=SC1091
  source "$STATE/env"
}

ARTIFACTS=$(mktemp -t cairn-test-artifacts.XXXXXX)
cold=0 total_start=$SECONDS
reported=0
on_exit() {
  local status=$?
  stop_cluster "$status"
  stop_background
  rm -f "$ARTIFACTS"
  # A run that failed early still shows where its time went.
  ((reported)) || report "$cold" $((SECONDS - total_start))
}
trap on_exit EXIT

# The step table against the budget; a warning for each step over its share.
report() {
  local cold=$1 total=$2 budget=$BUDGET_WARM table=SHARE_WARM name seconds share over=()
  reported=1
  if ((cold)); then table=SHARE_COLD; budget=$BUDGET_COLD; fi
  local -n shares=$table
  log "== timings ($( ((cold)) && echo "cold: the control plane was built" || echo warm), budget $budget s)"
  printf '  %-36s %6s %6s\n' step seconds share >&2
  for entry in "${timings[@]}"; do
    IFS=$'\t' read -r name seconds <<<"$entry"
    share=${shares[$name]:-}
    printf '  %-36s %6d %6s\n' "$name" "$seconds" "${share:--}" >&2
    if [[ -n $share ]] && ((seconds > share)); then over+=("$name: $seconds s, share $share s"); fi
  done
  printf '  %-36s %6d %6d\n' total "$total" "$budget" >&2
  local warning
  for warning in "${over[@]}"; do log "warning: over its share of the budget: $warning"; done
  ((total <= budget)) || log "warning: the run took $total s, over its budget of $budget s"
  [[ ! -s $CAIRN_CACHE/test-times.tsv ]] || {
    log "slowest test binaries (tier, seconds, verdict, binary):"
    sort -t$'\t' -k2,2nr "$CAIRN_CACHE/test-times.tsv" | head -n 10 | sed 's/^/  /' >&2
  }
}

# Whether this run builds the control plane (a cold run, for the budget).
[[ -d $(bin_dir) && -x $(bin_dir)/kube-apiserver ]] || cold=1

# Preparation in the background. apt is one at a time: the packages in one job.
background tools "$CAIRN_ROOT/hack/build-tools.sh"
background moto "$CAIRN_ROOT/hack/moto-venv.sh"
packages_and_bases() {
  "$CAIRN_ROOT/hack/postgres.sh"
  "$CAIRN_ROOT/hack/node-packages.sh"
  "$CAIRN_ROOT/hack/images.sh" bases >/dev/null
}
export -f packages_and_bases
background packages bash -c 'set -euo pipefail; packages_and_bases'

test_args=("$@")
((${#test_args[@]})) || test_args=(--workspace)
build_tests() {
  cargo test --locked --no-run --message-format=json-render-diagnostics "${test_args[@]}" >"$ARTIFACTS"
  # One binary's run (`-p cairn-e2e --test X`) still needs the images' and
  # the plugin's executables: the workspace's test build makes them, a
  # package's does not. A dev build is the same artifact as the test build's.
  if [[ ${test_args[*]} != --workspace ]]; then
    cargo build --locked --bins --message-format=json-render-diagnostics \
      -p cairn-instance -p cairn-database-controller -p cairn-backup-controller \
      -p cairn-cloud-controller -p kubectl-cairn >>"$ARTIFACTS"
  fi
  "$CAIRN_ROOT/hack/prune-target.sh" "$ARTIFACTS"
  # The plugin as this build made it, for e2e/tests/kubectl_plugin.rs.
  CAIRN_KUBECTL_CAIRN=$("$CAIRN_ROOT/hack/artifacts.py" bins "$ARTIFACTS" kubectl-cairn 2>/dev/null || true)
  if [[ -n $CAIRN_KUBECTL_CAIRN ]]; then export CAIRN_KUBECTL_CAIRN; else unset CAIRN_KUBECTL_CAIRN; fi
}
await_tools() { await tools; BIN=$(cat "$PREP/tools.out"); }

log "tier 1: no cluster"
if [[ "${CAIRN_SKIP_LINT:-}" == 1 ]]; then log "== lint skipped (CAIRN_SKIP_LINT=1)"; else step "lint: rust" lint_rust; fi
step "build tests" build_tests
if ((!$#)); then
  step "unit tier" "$CAIRN_ROOT/hack/run-tests.sh" unit "$ARTIFACTS"
  step "doc tests" cargo test --locked --workspace --doc --quiet
fi
# cargo-deny's build only now: `cargo install` holds cargo's package cache
# lock, and on a new machine it held clippy back for minutes.
background cargo-deny "$CAIRN_ROOT/hack/cargo-deny.sh"
step "wait: tools" await_tools
step "wait: cargo-deny" await cargo-deny
if [[ "${CAIRN_SKIP_LINT:-}" != 1 ]]; then step "lint: charts, workflows, deny" lint_rest; fi

log "tier 2: the cluster"
wait_packages() {
  await packages
  CAIRN_POSTGRES_BINDIR=$(head -n 1 "$PREP/packages.out")
  export CAIRN_POSTGRES_BINDIR
}
step "wait: packages and bases" wait_packages
step "wait: moto virtualenv" await moto
build_images() {
  IMAGES=$(CAIRN_IMAGE_ARTIFACTS=$ARTIFACTS "$CAIRN_ROOT/hack/images.sh" workspace)
}
step "images" build_images
step "local cluster up" start_cluster
# The charts' dependencies, built once: tests running side by side must not
# rebuild them under each other's helm.
build_charts() { "$CAIRN_ROOT/hack/charts.sh" "$BIN/helm"; export CAIRN_CHARTS_BUILT=1; }
step "chart dependencies" build_charts
status=0
if (($#)); then
  step "cargo test" cargo test --locked --no-fail-fast "${test_args[@]}" || status=$?
else
  step "cluster tier" "$CAIRN_ROOT/hack/run-tests.sh" cluster "$ARTIFACTS" || status=$?
fi
step "local cluster down" stop_cluster "$status"
report "$cold" $((SECONDS - total_start))
exit "$status"
