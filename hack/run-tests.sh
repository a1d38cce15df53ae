#!/usr/bin/env bash
# Runs the workspace's test binaries, one tier at a time:
#
#   hack/run-tests.sh unit ARTIFACTS      tier 1, no cluster: every unit-test
#       binary (each crate's lib and bins: pure code and the fake-API tests)
#       and the integration binaries in NO_CLUSTER, two at a time. A cluster
#       is not reachable from this tier (CAIRN_CLUSTER_STATE names no folder).
#   hack/run-tests.sh cluster ARTIFACTS   tier 2, against the running test
#       cluster, in three lanes side by side, then the binaries that need the
#       cluster to themselves:
#     - NODE_STOPPING, one at a time, first, in the second lane: they stop or
#       freeze a real node, which would stall any other binary's pods there;
#     - CRD_OWNERS, one at a time, next, in the second lane: a chart installs
#       its CRDs and the conversion webhook behind its Service, which two
#       releases would take from each other;
#     - REAL_NODES: on the real nodes too, their charts on the shared CRDs
#       (`crds.install=false`); any lane takes them, first, once no
#       NODE_STOPPING binary can run any more;
#     - NAMESPACED: any lane, when it has no REAL_NODES binary to take. They
#       use only their own namespaces, kwok nodes and local processes;
#     - ALONE, after the lanes: binaries that stop the API server, repoint a
#       CRD's conversion webhook or pause kube-controller-manager; and any
#       binary in no list (a new one runs alone until it is classified, with
#       a warning that says so).
#
# Most of a binary's time is waiting (pods, deadlines), so three lanes share
# the two cores well. The queues start with the binaries that took longest in
# the last run (times kept in the cache), so short ones fill the end.
#
# Each binary has a time limit (LIMIT, or LIMITS for the ones named there):
# past it, it is stopped (SIGTERM, SIGKILL 30 s later) and fails. A binary that
# fails is run again once with only its failed tests; if they pass, it is
# reported FLAKY (the run passes, with a warning naming them), never hidden.
# Each binary's output is printed whole when it ends; every binary runs even
# after a failure; the exit status says whether all passed. A table gives each
# binary's time, and a JUnit report of every test is written to
# $CAIRN_CACHE/test-results/<tier>.xml. The binaries are the ones `cargo test
# --no-run --message-format=json` reported building, in ARTIFACTS.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# Package folder (relative to the repository) and target: one per binary.
NO_CLUSTER=(
  api/committed_crds api/committed_reference api/conversion_roundtrip api/user_guide_examples
  cli/cli e2e/alerts
)
NAMESPACED=(
  controllers/backup/artifacts controllers/backup/backups controllers/backup/schedules
  controllers/cloud/buckets controllers/cloud/controller controllers/cloud/crash
  controllers/cloud/faults controllers/cloud/provider
  controllers/database/chart controllers/database/lifecycle
  controllers/database/reconcile_behaviour controllers/database/replicas
  controllers/instance/archiving controllers/instance/backups controllers/instance/failures
  controllers/instance/lifecycle controllers/instance/membership controllers/instance/replication
  e2e/api_schema e2e/smoke e2e/user_guide
  shared/runtime/apply_writes shared/runtime/finalizers shared/runtime/leader_election
  shared/storage/base_backups shared/storage/wal_archive
)
NODE_STOPPING=(e2e/failover e2e/synchronous e2e/stateful_set)
CRD_OWNERS=(e2e/real_nodes e2e/charts)
REAL_NODES=(
  e2e/backups e2e/dashboards e2e/kubectl_plugin e2e/service_account e2e/wal_archive
  e2e/cloud_chart e2e/backup_chart e2e/host_network
)
ALONE=(
  e2e/conversion_webhook e2e/webhook_self_managed e2e/webhook_rotation
  controllers/database/probes controllers/database/leftovers e2e/api_outage e2e/chaos
)
# Seconds a binary may run (the slowest take about half of their limit).
LIMIT=600
declare -A LIMITS=([e2e/chaos]=900 [e2e/real_nodes]=900)

tier=$1 artifacts=$2
[[ $tier == unit || $tier == cluster ]] || die "usage: hack/run-tests.sh unit|cluster ARTIFACTS"
work=$(mktemp -d -t cairn-lanes.XXXXXX)
trap 'rm -rf "$work"' EXIT

# One line per test binary: its key, package folder and executable.
"$CAIRN_ROOT/hack/artifacts.py" tests "$artifacts" >"$work/binaries"

listed() { # key list...
  local key=$1 entry; shift
  for entry in "$@"; do [[ $entry == "$key" ]] && return 0; done
  return 1
}
QUEUES=(unit node-stopping crd-owners real-nodes namespaced)
for queue in "${QUEUES[@]}" alone; do : >"$work/$queue"; done
unclassified=()
while IFS=$'\t' read -r key folder executable; do
  line=$(printf '%s\t%s\t%s' "$key" "$folder" "$executable")
  if [[ $key == *" (unit)" ]] || listed "$key" "${NO_CLUSTER[@]}"; then echo "$line" >>"$work/unit"
  elif listed "$key" "${NODE_STOPPING[@]}"; then echo "$line" >>"$work/node-stopping"
  elif listed "$key" "${CRD_OWNERS[@]}"; then echo "$line" >>"$work/crd-owners"
  elif listed "$key" "${REAL_NODES[@]}"; then echo "$line" >>"$work/real-nodes"
  elif listed "$key" "${NAMESPACED[@]}"; then echo "$line" >>"$work/namespaced"
  elif ! listed "$key" "${ALONE[@]}"; then unclassified+=("$line")
  fi
done <"$work/binaries"
# The alone ones in the list's order (the most disruptive last), unclassified first.
for line in "${unclassified[@]}"; do echo "$line" >>"$work/alone"; done
for key in "${ALONE[@]}"; do
  grep -P "^\Q$key\E\t" "$work/binaries" >>"$work/alone" || true
done

# Each binary's seconds in the last run, for the order of the queues
# (tier, seconds, verdict, key).
HISTORY=$CAIRN_CACHE/test-times.tsv
longest_first() { # queue-file
  awk -F'\t' 'NR == FNR { took[$4] = $2 + 0; next }
    { print ($1 in took ? took[$1] : 999999) "\t" $0 }' "$HISTORY" "$1" 2>/dev/null |
    sort -t$'\t' -k1,1nr -s | cut -f2- >"$1.sorted" && mv "$1.sorted" "$1" || true
}
if [[ -s $HISTORY ]]; then
  for queue in "${QUEUES[@]}"; do longest_first "$work/$queue"; done
fi

# The names of the tests libtest reported failed in OUTPUT, one per line.
failed_tests() { sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$1" | sort -u; }

# Runs one binary as cargo test would (from its package folder), its output
# kept until it ends; a failure is run again once with its failed tests only.
# LANE picks the binary's share of the test ports.
run_binary() { # lane key folder executable
  local lane=$1 key=$2 folder=$3 executable=$4 status=0 start=$SECONDS
  local output=$work/output.$BASHPID limit=${LIMITS[$key]:-$LIMIT}
  local env=(CARGO_MANIFEST_DIR="$CAIRN_ROOT/$folder" CAIRN_TEST_LANE="$lane" CAIRN_TEST_LANES=3)
  [[ $tier == cluster ]] || env+=(CAIRN_CLUSTER_STATE=/nonexistent/no-cluster-in-the-unit-tier)
  run() { # extra-args...
    (cd "$CAIRN_ROOT/$folder" &&
      exec env "${env[@]}" timeout --kill-after=30 "$limit" "$executable" "$@")
  }
  run >"$output" 2>&1 || status=$?
  local verdict=ok
  if ((status == 124 || status == 137)); then
    echo "hack/run-tests.sh: stopped after its limit of $limit s" >>"$output"
    verdict=TIMEOUT
  elif ((status != 0)); then
    verdict=FAILED
    local failed
    mapfile -t failed < <(failed_tests "$output")
    if ((${#failed[@]})) && [[ $tier == cluster ]]; then
      printf '\n--- %s: run again with its failed tests only: %s\n' "$key" "${failed[*]}" >>"$output"
      if run --exact "${failed[@]}" >>"$output" 2>&1; then verdict=FLAKY; fi
    fi
  fi
  local elapsed=$((SECONDS - start))
  {
    flock 9
    printf '\n     Running %s (%d s, %s)\n' "$key" "$elapsed" "$verdict"
    cat "$output"
    printf '%s\t%d\t%s\t%s\n' "$tier" "$elapsed" "$verdict" "$key" >>"$work/times"
    # key, then libtest's result lines, for the JUnit report.
    { printf '=== %s\t%d\n' "$key" "$elapsed"; grep -E '^test .* \.\.\. (ok|FAILED|ignored)' "$output" || true; } >>"$work/results"
  } 9>"$work/print.lock"
  rm -f "$output"
}

# The first line of a queue, removed from it; fails when it is empty.
take() { # queue-file
  {
    flock 8
    local line
    line=$(head -n 1 "$1")
    [[ -n $line ]] || return 1
    sed -i 1d "$1"
    printf '%s\n' "$line"
  } 8>"$1.lock"
}

run_queue() { # lane queue-file
  local line key folder executable
  while line=$(take "$2"); do
    IFS=$'\t' read -r key folder executable <<<"$line"
    run_binary "$1" "$key" "$folder" "$executable"
  done
}

# A lane of the cluster tier: a REAL_NODES binary once the nodes stay up
# (the marker NODES_STEADY exists), else a NAMESPACED one; with only
# REAL_NODES binaries left before the marker, it waits for the marker.
NODES_STEADY=$work/nodes-steady
run_lane() { # lane
  local line key folder executable
  while :; do
    if [[ -e $NODES_STEADY ]] && line=$(take "$work/real-nodes"); then :
    elif line=$(take "$work/namespaced"); then :
    elif [[ ! -e $NODES_STEADY && -s $work/real-nodes ]]; then sleep 1 && continue
    elif line=$(take "$work/real-nodes"); then :
    else return 0
    fi
    IFS=$'\t' read -r key folder executable <<<"$line"
    run_binary "$1" "$key" "$folder" "$executable"
  done
}

: >"$work/times"
: >"$work/results"
if [[ $tier == unit ]]; then
  run_queue 0 "$work/unit" &
  first=$!
  run_queue 1 "$work/unit" &
  second=$!
  wait "$first" "$second"
else
  for line in "${unclassified[@]}"; do
    log "warning: ${line%%$'\t'*} is in no list of hack/run-tests.sh: it runs alone, after the lanes"
  done
  run_lane 0 &
  first=$!
  { run_queue 1 "$work/node-stopping"; touch "$NODES_STEADY"; run_queue 1 "$work/crd-owners"; run_lane 1; } &
  second=$!
  run_lane 2 &
  third=$!
  wait "$first" "$second" "$third"
  run_queue 0 "$work/alone"
fi

# This tier's rows replace its rows of the last run.
mkdir -p "$CAIRN_CACHE"
{ [[ ! -s $HISTORY ]] || awk -F'\t' -v t="$tier" '$1 != t' "$HISTORY"; cat "$work/times"; } >"$work/history"
cp "$work/history" "$HISTORY"

# JUnit: a test suite per binary, a test case per libtest result line.
mkdir -p "$CAIRN_CACHE/test-results"
python3 - "$work/results" "$CAIRN_CACHE/test-results/$tier.xml" "$tier" <<'PY'
import sys
from xml.sax.saxutils import quoteattr
results, out, tier = sys.argv[1:]
suites, current = [], None
for line in open(results, encoding="utf-8", errors="replace"):
    line = line.rstrip("\n")
    if line.startswith("=== "):
        key, seconds = line[4:].rsplit("\t", 1)
        current = {"name": key, "time": seconds, "cases": []}
        suites.append(current)
    elif current is not None and line.startswith("test "):
        name, _, verdict = line[5:].rpartition(" ... ")
        current["cases"].append((name, verdict))
# A test that failed and then passed when run again is reported once, passed
# and marked flaky (as cargo-nextest reports it).
for s in suites:
    seen = {}
    for name, verdict in s["cases"]:
        if name in seen and seen[name] == "FAILED" and verdict == "ok":
            verdict = "flaky"
        seen[name] = verdict
    s["cases"] = list(seen.items())
with open(out, "w", encoding="utf-8") as f:
    f.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    f.write(f"<testsuites name={quoteattr(tier)}>\n")
    for s in suites:
        failures = sum(1 for _, v in s["cases"] if v == "FAILED")
        skipped = sum(1 for _, v in s["cases"] if v == "ignored")
        f.write(f'  <testsuite name={quoteattr(s["name"])} tests="{len(s["cases"])}" '
                f'failures="{failures}" skipped="{skipped}" time="{s["time"]}">\n')
        for name, verdict in s["cases"]:
            f.write(f'    <testcase classname={quoteattr(s["name"])} name={quoteattr(name)}>')
            if verdict == "FAILED":
                f.write('<failure message="failed"/>')
            elif verdict == "ignored":
                f.write("<skipped/>")
            elif verdict == "flaky":
                f.write("<system-out>flaky: failed, then passed when run again</system-out>")
            f.write("</testcase>\n")
        f.write("  </testsuite>\n")
    f.write("</testsuites>\n")
PY

log "$tier tier: test binaries, slowest first (seconds, verdict, binary):"
sort -t$'\t' -k2,2nr "$work/times" | cut -f2- | sed 's/^/  /' >&2
total=$(wc -l <"$work/times")
flaky=$(awk -F'\t' '$3 == "FLAKY" {print "  " $4}' "$work/times")
[[ -z $flaky ]] || log "warning: flaky (failed, then passed when run again):
$flaky"
failed=$(awk -F'\t' '$3 == "FAILED" || $3 == "TIMEOUT" {print "  " $4 " (" $3 ")"}' "$work/times")
[[ -z $failed ]] || die "$tier tier: test binaries failed (of $total):
$failed"
log "$tier tier: all $total test binaries passed"
