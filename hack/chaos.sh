#!/usr/bin/env bash
# A chaos run of any length: the chaos test of the suite (e2e/tests/chaos.rs)
# with other seeds and minutes, on a fresh local cluster, printing the seed,
# every action taken, the actions per kind and the invariants' table.
#
#   hack/chaos.sh [--seed N[,N...]] [--minutes M] [--inject-bug NAME]
#
# Defaults: one seed from the clock (printed), 30 minutes. --inject-bug runs
# it on a copy of the commit with e2e/chaos-bugs/NAME.patch applied (a bug
# put in on purpose, never in the product) and succeeds only if the run
# fails, naming a violated invariant: the proof that the invariants can fail.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$CAIRN_ROOT"

seeds=$(date +%s)
minutes=30
bug=""
while (($#)); do
  case "$1" in
    --seed) seeds=${2:?--seed N}; shift 2 ;;
    --minutes) minutes=${2:?--minutes M}; shift 2 ;;
    --inject-bug) bug=${2:?--inject-bug NAME}; shift 2 ;;
    *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
log "chaos: seeds $seeds, $minutes minutes each${bug:+, with the injected bug $bug}"
# The controllers' and instances' logs of the whole run are kept (the run
# copies the pods' logs every 10 s), passed or failed.
export CAIRN_CHAOS_SEEDS=$seeds CAIRN_CHAOS_MINUTES=$minutes CAIRN_SKIP_LINT=1 CAIRN_KEEP_LOGS=1
if [[ -z $bug ]]; then
  exec hack/test.sh -p cairn-e2e --test chaos -- --nocapture
fi

patch=$CAIRN_ROOT/e2e/chaos-bugs/$bug.patch
[[ -f $patch ]] || die "no such bug: $patch (see e2e/chaos-bugs/)"
copy=$(mktemp -d "${TMPDIR:-/tmp}/cairn-chaos-bug.XXXXXX")
trap 'git -C "$CAIRN_ROOT" worktree remove --force "$copy/tree" 2>/dev/null || true; rm -rf "$copy"' EXIT
git worktree add --quiet --detach "$copy/tree" HEAD
git -C "$copy/tree" apply "$patch"
output=$copy/output
if "$copy/tree/hack/test.sh" -p cairn-e2e --test chaos -- --nocapture 2>&1 | tee "$output"; then
  die "the chaos run passed with the injected bug $bug: no invariant caught it"
fi
grep -o 'invariants violated: [a-z, -]*' "$output" ||
  die "the run with the injected bug $bug failed, but not on an invariant (see above)"
log "the injected bug $bug was caught"
