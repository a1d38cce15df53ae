#!/usr/bin/env bash
# Builds the charts' dependencies into charts/*/charts/ (git-ignored): each
# controller chart includes the cairn-common library chart, and the cairn
# umbrella chart the controller charts, so the umbrella is built last (it
# packages them with their library). Run after changing a chart and before
# helm lint, template, install or package; hack/test.sh, hack/dev-up.sh and
# the tests' Helm helpers run it. Quick (no network: every dependency is a
# file:// chart of this repository).
#   hack/charts.sh [HELM]
set -euo pipefail
source "$(dirname "$0")/lib.sh"

helm=${1:-$(bin_dir)/helm}
cd "$CAIRN_ROOT/charts"
for chart in */; do
  chart=${chart%/}
  [[ $chart == cairn || $chart == cairn-common ]] && continue
  grep -q '^dependencies:' "$chart/Chart.yaml" || continue
  "$helm" dependency build "$chart" >/dev/null
done
[[ -d cairn ]] && "$helm" dependency build cairn >/dev/null
exit 0
