#!/usr/bin/env bash
# The Debian packages a real node of the local cluster needs: the container
# runtime (containerd, runc), the CNI plugins, kube-proxy's tools (iptables,
# conntrack, ipset), what kubelet's port-forward needs (socat), and what builds the
# images (mmdebstrap, umoci). Installs those missing, as postgres.sh does for PostgreSQL.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PACKAGES=(containerd runc containernetworking-plugins iptables conntrack ipset socat ethtool iproute2 mmdebstrap umoci)

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f '${db:Status-Status}' "$package" 2>/dev/null | grep -qx installed || missing+=("$package")
done
((${#missing[@]})) || exit 0

as_root=()
if ((EUID != 0)); then
  sudo -n true 2>/dev/null || die "missing packages and sudo needs a password: apt-get install ${missing[*]}"
  as_root=(sudo -n)
fi
log "installing ${missing[*]} from Debian's packages"
apt_install() {
  # The package's own containerd service must not start: each node runs its own.
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}
apt_install || { "${as_root[@]}" apt-get update -qq >&2 && apt_install; }
