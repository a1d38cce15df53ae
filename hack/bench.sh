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
#   hack/bench.sh backup [SCALE]          Cairn against pgBackRest (Debian's)
#                                         on the same data (pgbench scale,
#                                         default 10) and the same S3 endpoint
#                                         (moto behind a TLS front): base
#                                         backup, restore, WAL archiving
#   hack/bench.sh failover [N] [synchronous] [kill]
#                                         N primary node stops (default 10) on
#                                         the real nodes, the controller from
#                                         its chart: promotion, write
#                                         unavailability, rejoin, rows lost;
#                                         with synchronous replication if asked;
#                                         with kill, SIGKILL of the primary's
#                                         container instead of a node stop
#   hack/bench.sh footprint               the three controllers from their
#                                         charts on the real nodes, idle: each
#                                         replica's RSS (anonymous / mapped),
#                                         threads, CPU
#   hack/bench.sh cnpg-side-by-side [N]   Cairn's database controller, then
#                                         CloudNativePG's operator (built from
#                                         its pinned module on first use), each
#                                         against N single-instance clusters
#                                         (default 100) on the kwok nodes of one
#                                         cluster: RSS, CPU, writes per cluster
#                                         by verb, the idle minute, the ratios
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
  footprint) ;;
  backup) ;;
  cnpg-side-by-side) count=${2:-100} ;;
  *) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

if [[ $bench == backup ]]; then
  CAIRN_POSTGRES_BINDIR=$(hack/postgres.sh)
  export CAIRN_POSTGRES_BINDIR
  for package in pgbackrest stunnel4; do
    command -v "$package" >/dev/null || {
      log "installing $package from Debian's packages"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >&2 ||
        { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >&2; }
    }
  done
  STATE=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench.XXXXXX")/cluster
  tls=$(dirname "$STATE")/tls
  trap 'kill "$(cat "$tls/stunnel.pid" 2>/dev/null)" 2>/dev/null || true; hack/local-cluster.sh down "$STATE"; rm -rf "$tls"; rmdir "$(dirname "$STATE")" 2>/dev/null || true' EXIT
  hack/local-cluster.sh up "$STATE"
  # pgBackRest speaks only HTTPS to S3, and checks a DNS name (not an IP)
  # in the certificate: moto behind stunnel, at https://localhost.
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=cairn-bench-ca \
    -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout "$tls/s3.key" -out "$tls/s3.csr" 2>/dev/null
  openssl x509 -req -in "$tls/s3.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial -days 1 \
    -extfile <(echo "subjectAltName=DNS:localhost") -out "$tls/s3.crt" 2>/dev/null
  cat "$tls/s3.crt" "$tls/s3.key" >"$tls/s3.pem"
  moto=$(sed -n 's/^\(export \)\{0,1\}CAIRN_S3_ENDPOINT=//p' "$STATE/env" | tr -d "\"'")
  [[ $moto == http://* ]] || die "no moto URL in $STATE/env"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # pgBackRest runs as postgres and reads the CA (public) from here.
  chmod 755 "$(dirname "$STATE")" "$tls" && chmod 644 "$tls/ca.crt"
  printf 'foreground = no\npid = %s\n[s3]\naccept = 127.0.0.1:%s\nconnect = %s\ncert = %s\n' \
    "$tls/stunnel.pid" "$port" "${moto#http://}" "$tls/s3.pem" >"$tls/stunnel.conf"
  stunnel4 "$tls/stunnel.conf"
  CAIRN_CLUSTER_STATE=$STATE CAIRN_BENCH_S3=https://localhost:$port SSL_CERT_FILE=$tls/ca.crt \
    CAIRN_BENCH_PGBACKREST=$(command -v pgbackrest) \
    cargo bench --locked -p cairn-instance --bench backup -- "${2:-10}"
  exit 0
fi

if [[ $bench == failover || $bench == footprint ]]; then
  # Figures users would see: the optimised release binaries, not the test build's.
  images=$(CAIRN_IMAGE_PROFILE=release hack/images.sh workspace)
  STATE=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench.XXXXXX")/cluster
  trap 'hack/local-cluster.sh down "$STATE"; rmdir "$(dirname "$STATE")" 2>/dev/null || true' EXIT
  hack/local-cluster.sh up "$STATE"
  hack/local-cluster.sh import-images "$STATE" "$images"/*.tar
  if [[ $bench == failover ]]; then
    CAIRN_CLUSTER_STATE=$STATE cargo bench --locked -p cairn-e2e --bench failover -- "$count" "${@:3}"
  else
    CAIRN_CLUSTER_STATE=$STATE cargo bench --locked -p cairn-e2e --bench controller_footprint
  fi
  exit 0
fi

if [[ $bench == cnpg-side-by-side ]]; then
  CAIRN_CNPG_BIN=$(hack/build-tools.sh cnpg)
  cargo build --release --locked -p cairn-database-controller
  # The same control plane for both operators, its workload controllers at
  # the client rate a cluster sized for thousands of Jobs and StatefulSets has.
  export CAIRN_CONTROLLER_MANAGER_QPS=${CAIRN_CONTROLLER_MANAGER_QPS:-100}
  STATE=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench.XXXXXX")/cluster
  trap 'hack/local-cluster.sh down "$STATE"; rmdir "$(dirname "$STATE")" 2>/dev/null || true' EXIT
  hack/local-cluster.sh up "$STATE"
  CAIRN_CLUSTER_STATE=$STATE CAIRN_CNPG_BIN=$CAIRN_CNPG_BIN \
    CAIRN_DATABASE_CONTROLLER=$CARGO_TARGET_DIR/release/cairn-database-controller \
    cargo bench --locked -p cairn-e2e --bench cnpg_side_by_side -- "$count"
  exit 0
fi

cargo build --release --locked -p cairn-database-controller
# A control plane sized for the load (hack/local-cluster.sh): at upstream's
# client rates and concurrency its StatefulSet controller, scheduler and
# garbage collector, not the operator, make most of the figure.
export CAIRN_CONTROL_PLANE=${CAIRN_CONTROL_PLANE:-large}
STATE=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench.XXXXXX")/cluster
trap 'hack/local-cluster.sh down "$STATE"; rmdir "$(dirname "$STATE")" 2>/dev/null || true' EXIT
hack/local-cluster.sh up "$STATE"
CAIRN_CLUSTER_STATE=$STATE \
  CAIRN_DATABASE_CONTROLLER=$CARGO_TARGET_DIR/release/cairn-database-controller \
  cargo bench --locked -p cairn-e2e --bench database_clusters -- "$count" \
  $([[ $bench == churn ]] && echo churn)
