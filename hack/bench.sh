#!/usr/bin/env bash
# Benchmarks: they print figures, they assert nothing. The controller ones
# run against a fresh local cluster in a temporary folder, stopped on exit;
# the instance one needs no cluster, only PostgreSQL (installed if missing).
#
#   hack/bench.sh database-clusters [N]   N single-instance DatabaseClusters
#                                         (default 100): time to Ready, requests
#                                         per cluster, peak RSS, idle writes
#   hack/bench.sh churn [N]               N clusters (default 2000) created and
#                                         deleted 200 at a time: the
#                                         controller's RSS before and after
#   hack/bench.sh instance [SCALE]        cairn-instance with real PostgreSQL
#                                         (pgbench scale, default 10): base
#                                         backup, replica lag under pgbench,
#                                         the instance's idle cost, promotion
#   hack/bench.sh failover [N] [synchronous]
#                                         N primary node stops (default 10) on
#                                         the real nodes, the controller from
#                                         its chart: promotion, write
#                                         unavailability, rejoin, rows lost;
#                                         with synchronous replication if asked
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$CAIRN_ROOT"

bench=${1:-}
case "$bench" in
  database-clusters) count=${2:-100} ;;
  churn) count=${2:-2000} ;;
  instance)
    CAIRN_POSTGRES_BINDIR=$(hack/postgres.sh)
    export CAIRN_POSTGRES_BINDIR
    exec cargo bench --locked -p cairn-instance --bench instance -- "${2:-10}" ;;
  failover) count=${2:-10} ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

if [[ $bench == failover ]]; then
  images=$(hack/images.sh workspace)
  STATE=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench.XXXXXX")/cluster
  trap 'hack/local-cluster.sh down "$STATE"; rmdir "$(dirname "$STATE")" 2>/dev/null || true' EXIT
  hack/local-cluster.sh up "$STATE"
  hack/local-cluster.sh import-images "$STATE" "$images"/*.tar
  CAIRN_CLUSTER_STATE=$STATE cargo bench --locked -p cairn-e2e --bench failover -- "$count" "${@:3}"
  exit 0
fi

cargo build --release --locked -p cairn-database-controller
# The garbage collector deletes every child of a deleted cluster: at the
# upstream client rate (20/s) thousands of children take many minutes.
[[ $bench == churn ]] && export CAIRN_CONTROLLER_MANAGER_QPS=${CAIRN_CONTROLLER_MANAGER_QPS:-100}
STATE=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench.XXXXXX")/cluster
trap 'hack/local-cluster.sh down "$STATE"; rmdir "$(dirname "$STATE")" 2>/dev/null || true' EXIT
hack/local-cluster.sh up "$STATE"
CAIRN_CLUSTER_STATE=$STATE \
  CAIRN_DATABASE_CONTROLLER=$CARGO_TARGET_DIR/release/cairn-database-controller \
  cargo bench --locked -p cairn-e2e --bench database_clusters -- "$count" \
  $([[ $bench == churn ]] && echo churn)
