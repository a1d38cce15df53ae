#!/usr/bin/env bash
# Brings up the local development environment: the Kubernetes cluster with
# real nodes, three kwok nodes and the moto fake AWS (hack/local-cluster.sh),
# reusing it if it already runs; builds the images (hack/images.sh) and gives
# them to the nodes; installs the umbrella chart charts/cairn with Helm as
# release `cairn` (the three controllers run in pods in namespace
# cairn-system, watching cairn-samples);
# creates a sample of every kind in cairn-samples, the DatabaseCluster's
# PostgreSQL running on the real nodes and archiving to a bucket in moto, the
# ProviderConfig pointing at moto (with the DnsRecord's zone made there).
# Prints how to use it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE=$CAIRN_CACHE/clusters/dev
CONTROLLER_NAMESPACE=cairn-system
SAMPLES=cairn-samples
# The images (a Rust build and Debian bases) are made beside the control
# plane's build and start, which need them only at the import.
"$CAIRN_ROOT/hack/node-packages.sh"
images_out=$(mktemp) images_log=$(mktemp)
trap 'rm -f "$images_out" "$images_log"' EXIT
"$CAIRN_ROOT/hack/images.sh" workspace >"$images_out" 2>"$images_log" &
images_pid=$!
"$CAIRN_ROOT/hack/local-cluster.sh" up "$STATE"
# shellcheck disable=SC1091
source "$STATE/env"
if ! wait "$images_pid"; then
  cat "$images_log" >&2
  die "building the images failed"
fi
images=$(cat "$images_out")
"$CAIRN_ROOT/hack/local-cluster.sh" import-images "$STATE" "$images"/*.tar

kubectl() { "$CAIRN_BIN/kubectl" "$@"; }
helm() { "$CAIRN_BIN/helm" "$@"; }
for namespace in "$SAMPLES" "$CONTROLLER_NAMESPACE"; do
  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
done
kubectl label --overwrite namespace "$CONTROLLER_NAMESPACE" \
  pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest >/dev/null

# The sample DnsRecord's hosted zone, made in moto once, before the
# cloud controller starts (a missing zone is terminal until the spec changes),
# and the sample DatabaseCluster's backup bucket.
"$("$CAIRN_ROOT/hack/moto-venv.sh")/bin/python" - "$CAIRN_S3_ENDPOINT" <<'PY'
import sys, boto3
route53 = boto3.client("route53", endpoint_url=sys.argv[1], region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
if not any(z["Name"] == "example.com." for z in route53.list_hosted_zones()["HostedZones"]):
    route53.create_hosted_zone(Name="example.com", CallerReference="cairn-samples")
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
if "acme-db-backups" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
    s3.create_bucket(Bucket="acme-db-backups")
PY
# A new image under the same tag must reach the running pods: the release
# records the image's digest, so a rebuilt image rolls the Deployment.
log "installing the umbrella chart"
"$CAIRN_ROOT/hack/charts.sh" "$CAIRN_BIN/helm"
# Releases of each controller chart by an earlier version of this script own
# the CRDs: they give way to the umbrella release (the CRDs and the samples
# stay: the CRDs are kept on uninstall).
for chart in cairn-database-controller cairn-cloud-controller cairn-backup-controller; do
  if helm status "$chart" --namespace "$CONTROLLER_NAMESPACE" >/dev/null 2>&1; then
    helm uninstall "$chart" --namespace "$CONTROLLER_NAMESPACE" --wait >/dev/null
    kubectl get crd -o name | grep 'cairn\.dev$' | xargs kubectl annotate --overwrite \
      meta.helm.sh/release-name=cairn meta.helm.sh/release-namespace="$CONTROLLER_NAMESPACE" >/dev/null
  fi
done
values=()
for controller in database cloud backup; do
  digest=$(sha256sum "$images/ghcr.io_cairn-dev_cairn-$controller-controller.tar" | cut -c1-12)
  values+=(--set "$controller.watchNamespace=$SAMPLES" --set "$controller.image.pullPolicy=Never"
    --set-string "$controller.podAnnotations.cairn\\.dev/image-archive=$digest")
done
helm upgrade --install cairn "$CAIRN_ROOT/charts/cairn" --namespace "$CONTROLLER_NAMESPACE" \
  "${values[@]}" --wait --timeout 3m >/dev/null

# The samples as they are, but for the DatabaseCluster's PostgreSQL version
# and storage (here the one database image is Debian 12's PostgreSQL 15, and
# local-path volumes are the ones a non-root pod can write) and the
# S3 endpoints: moto, with its fixed test credentials.
for secret in aws-credentials backup-credentials; do
  kubectl -n "$SAMPLES" create secret generic "$secret" --from-literal=AWS_ACCESS_KEY_ID=testing \
    --from-literal=AWS_SECRET_ACCESS_KEY=testing --dry-run=client -o yaml | kubectl apply -f - >/dev/null
done
for sample in "$CAIRN_ROOT"/config/samples/*.yaml; do
  echo "---"
  case $sample in
    *databasecluster*) sed -e 's/version: "17"/version: "15"/' -e "s|endpoint: https://s3.eu-west-1.amazonaws.com|endpoint: $CAIRN_S3_ENDPOINT|" -e 's/^  storage:$/  storage:\n    storageClassName: local-path/' -e 's/size: 10Gi/size: 1Gi/' "$sample" ;;
    *providerconfig*) sed -e "s|^  region: .*|&\n  endpoint: $CAIRN_S3_ENDPOINT|" "$sample" ;;
    *) cat "$sample" ;;
  esac
done | kubectl -n "$SAMPLES" apply -f - >/dev/null

cat <<USAGE

Cairn local cluster is up: Kubernetes $KUBERNETES_VERSION, $CAIRN_REAL_NODES real nodes and 3 kwok nodes
(tainted: only pods that tolerate kwok.x-k8s.io/node land there), moto at $CAIRN_S3_ENDPOINT.

  export KUBECONFIG=$KUBECONFIG
  export PATH=$CAIRN_BIN:\$PATH      # the pinned kubectl and helm
  kubectl get nodes -L type,topology.kubernetes.io/zone
  kubectl -n $CONTROLLER_NAMESPACE get pods        # the database, cloud and backup controllers (helm release cairn, charts/cairn)
  helm -n $CONTROLLER_NAMESPACE test cairn          # each controller answers /readyz
  kubectl -n $SAMPLES get cairn                    # one sample of every Cairn kind
  kubectl -n $SAMPLES get dbc,pods,pvc,services    # the sample cluster's PostgreSQL (Ready in about a minute)

  psql on the sample cluster's primary, through its -rw Service:
    kubectl -n $SAMPLES exec -it orders-0 -- sh -c 'psql "host=orders-rw user=\$(cat /etc/cairn/credentials/username) dbname=\$(cat /etc/cairn/credentials/database) password=\$(cat /etc/cairn/credentials/password)"'

  the sample ObjectBucket is a bucket in moto, its connection details in Secret backups-bucket;
  the sample DnsRecord a record set in moto's hosted zone example.com:
    kubectl -n $SAMPLES get objectbucket,dnsrecord,providerconfig; kubectl -n $SAMPLES get secret backups-bucket

  the sample Backup, a base backup taken by a standby of orders into moto's bucket acme-db-backups:
    kubectl -n $SAMPLES get backups     # Completed once the cluster is Ready; status has its WAL range and size
    kubectl -n $SAMPLES get backupschedules   # the nightly schedule: next slot, BackupsHealthy

  rebuild and roll the controller after a change:  hack/dev-up.sh
  logs of each component:  $STATE/logs/     stop it:  hack/local-cluster.sh down
USAGE
