#!/usr/bin/env bash
# Benchmarks: they print figures, they assert nothing. Each runs against a
# fresh local cluster in a temporary folder, stopped on exit.
#
#   hack/bench.sh database-clusters [N]   N single-instance DatabaseClusters
#                                         (default 100): time to Ready, requests
#                                         per cluster, peak RSS, idle writes
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$CAIRN_ROOT"

bench=${1:-}
case "$bench" in
  database-clusters) count=${2:-100} ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

cargo build --release --locked -p cairn-database-controller
STATE=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench.XXXXXX")/cluster
trap 'hack/local-cluster.sh down "$STATE"; rmdir "$(dirname "$STATE")" 2>/dev/null || true' EXIT
hack/local-cluster.sh up "$STATE"
CAIRN_CLUSTER_STATE=$STATE \
  CAIRN_DATABASE_CONTROLLER=$CARGO_TARGET_DIR/release/cairn-database-controller \
  cargo bench --locked -p cairn-e2e --bench database_clusters -- "$count"
