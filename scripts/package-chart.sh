#!/usr/bin/env bash
# Packages the Helm chart into a chart repository directory, under two names:
#   vmdhcp-<version>.tgz                        for `helm install` of this project;
#   harvester-vm-dhcp-controller-<version>.tgz  the same chart under upstream's name, for
#                                               Harvester's add-on: the Addon's spec.chart cannot
#                                               change (Harvester's webhook refuses it), so a
#                                               user switches the existing add-on by changing
#                                               only spec.repo, spec.version and
#                                               spec.valuesContent.
# and writes the repository's index.yaml (`helm repo index`). The two packages render the same
# objects but for the helm.sh/chart label: names and selectors come from "vmdhcp", never from
# the published name (chart/templates/_helpers.tpl).
#
# Usage: scripts/package-chart.sh OUT_DIR [REPO_URL]
#   OUT_DIR   created if missing; the packages and index.yaml go there
#   REPO_URL  the address the repository is served from (index.yaml's urls); default: relative
# HELM names the helm binary (default: helm on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
helm="${HELM:-helm}"

[ "$#" -ge 1 ] || { echo "usage: $0 OUT_DIR [REPO_URL]" >&2; exit 2; }
out="$1"
url="${2:-}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$helm" package "$root/chart" --destination "$out" >/dev/null
cp -r "$root/chart" "$work/harvester-vm-dhcp-controller"
sed -i 's/^name: vmdhcp$/name: harvester-vm-dhcp-controller/' \
  "$work/harvester-vm-dhcp-controller/Chart.yaml"
grep -q '^name: harvester-vm-dhcp-controller$' "$work/harvester-vm-dhcp-controller/Chart.yaml" \
  || { echo "$0: chart/Chart.yaml has no 'name: vmdhcp' line to rename" >&2; exit 1; }
"$helm" package "$work/harvester-vm-dhcp-controller" --destination "$out" >/dev/null

if [ -n "$url" ]; then
  "$helm" repo index "$out" --url "$url"
else
  "$helm" repo index "$out"
fi
ls "$out"/*.tgz
