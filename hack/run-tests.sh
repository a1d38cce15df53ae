#!/usr/bin/env bash
# Runs the workspace's test binaries against the running test cluster in two
# lanes side by side, then the binaries that need the cluster to themselves:
#   - cluster-wide binaries, one at a time in the second lane: they install
#     the charts cluster-wide (two Helm releases race on the CRDs' ownership)
#     or stop and freeze the real nodes;
#   - namespaced binaries, every one not listed below, and the doc tests: the
#     first lane takes them from a shared queue at once, the second once its
#     cluster-wide binaries are done. They use only their own namespaces,
#     kwok nodes and local processes;
#   - alone, after both lanes: binaries that stop the API server, repoint a
#     CRD's conversion webhook or pause kube-controller-manager.
# Most of a binary's time is waiting (pods, cron slots, deadlines), so the
# lanes share the two cores well. The queues start with the binaries that
# took longest in the last run (times kept in the cache), so short ones fill
# the end. A new test binary that changes anything outside its namespaces
# belongs in one of the lists below.
#
# Each binary's output is printed whole when it ends; every binary runs even
# after a failure; the exit status says whether all passed, and a table gives
# each binary's time. The binaries are the ones `cargo test --no-run
# --message-format=json` reported building, in ARTIFACTS:
#   hack/run-tests.sh ARTIFACTS
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# Package folder (relative to the repository) and target: one per binary.
CLUSTER_WIDE=(
  e2e/real_nodes e2e/failover e2e/synchronous e2e/stateful_set e2e/backups
  e2e/dashboards e2e/kubectl_plugin e2e/service_account e2e/wal_archive
  e2e/charts e2e/cloud_chart e2e/backup_chart e2e/host_network
)
ALONE=(
  e2e/conversion_webhook e2e/webhook_self_managed e2e/webhook_rotation
  controllers/database/probes controllers/database/leftovers e2e/chaos
)

artifacts=$1
work=$(mktemp -d -t cairn-lanes.XXXXXX)
trap 'rm -rf "$work"' EXIT

# One line per test binary: its key, package folder and executable.
python3 - "$artifacts" "$CAIRN_ROOT" >"$work/binaries" <<'PY'
import json, os, sys
artifacts, root = sys.argv[1], sys.argv[2]
for line in open(artifacts):
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if message.get("reason") != "compiler-artifact" or not message.get("executable"):
        continue
    if not message["profile"]["test"]:
        continue
    folder = os.path.relpath(os.path.dirname(message["manifest_path"]), root)
    target = message["target"]
    name = target["name"] if "test" in target["kind"] else f"{target['name']} (unit)"
    print(f"{folder}/{name}\t{folder}\t{message['executable']}")
PY

listed() { # key list...
  local key=$1 entry; shift
  for entry in "$@"; do [[ $entry == "$key" ]] && return 0; done
  return 1
}
printf 'doc tests\t.\tdoc\n' >>"$work/binaries"
: >"$work/namespaced"
: >"$work/cluster-wide"
while IFS=$'\t' read -r key folder executable; do
  line=$(printf '%s\t%s\t%s' "$key" "$folder" "$executable")
  if listed "$key" "${CLUSTER_WIDE[@]}"; then echo "$line" >>"$work/cluster-wide"
  elif ! listed "$key" "${ALONE[@]}"; then echo "$line" >>"$work/namespaced"
  fi
done <"$work/binaries"
# The alone ones in the list's order (the most disruptive last).
: >"$work/alone"
for key in "${ALONE[@]}"; do
  grep -P "^\Q$key\E\t" "$work/binaries" >>"$work/alone" || true
done

# Each binary's seconds in the last run, for the order of the queues.
HISTORY=$CAIRN_CACHE/test-times.tsv
longest_first() { # queue-file
  awk -F'\t' 'NR == FNR { took[$3] = $1 + 0; next }
    { print ($1 in took ? took[$1] : 999999) "\t" $0 }' "$HISTORY" "$1" 2>/dev/null |
    sort -t$'\t' -k1,1nr -s | cut -f2- >"$1.sorted" && mv "$1.sorted" "$1" || true
}
if [[ -s $HISTORY ]]; then longest_first "$work/namespaced"; longest_first "$work/cluster-wide"; fi

# Runs one binary as cargo test would (from its package folder), its output
# kept until it ends. LANE picks the binary's share of the test ports.
run_binary() { # lane key folder executable
  local lane=$1 key=$2 folder=$3 executable=$4 status=0 start=$SECONDS
  local output=$work/output.$BASHPID
  if [[ $executable == doc ]]; then
    cargo test --locked --workspace --doc >"$output" 2>&1 || status=$?
  else
    (cd "$CAIRN_ROOT/$folder" &&
      CARGO_MANIFEST_DIR=$CAIRN_ROOT/$folder CAIRN_TEST_LANE=$lane CAIRN_TEST_LANES=2 \
        "$executable") >"$output" 2>&1 || status=$?
  fi
  local elapsed=$((SECONDS - start)) verdict=ok
  ((status == 0)) || verdict=FAILED
  {
    flock 9
    printf '\n     Running %s (%d s, %s)\n' "$key" "$elapsed" "$verdict"
    cat "$output"
    printf '%6d s\t%s\t%s\n' "$elapsed" "$verdict" "$key" >>"$work/times"
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

run_queue 0 "$work/namespaced" &
first=$!
{ run_queue 1 "$work/cluster-wide"; run_queue 1 "$work/namespaced"; } &
second=$!
wait "$first" "$second"
run_queue 0 "$work/alone"
cp "$work/times" "$HISTORY"

log "test binaries, slowest first:"
sort -rn "$work/times" >&2
total=$(wc -l <"$work/times")
failed=$(awk -F'\t' '$2 == "FAILED" {print "  " $3}' "$work/times")
[[ -z $failed ]] || die "test binaries failed (of $total):
$failed"
log "all $total test binaries passed"
