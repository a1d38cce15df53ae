#!/usr/bin/env bash
# PostgreSQL server programs for the instance tests, from Debian's packages:
# installs postgresql-<version> when its programs are missing, then prints the
# folder that holds postgres, initdb and pg_basebackup.
#   CAIRN_POSTGRES_VERSION   major version (default: 15, Debian 12's)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

version=${CAIRN_POSTGRES_VERSION:-15}
bindir=/usr/lib/postgresql/$version/bin

installed() { [[ -x $bindir/postgres && -x $bindir/initdb && -x $bindir/pg_basebackup ]]; }

if ! installed; then
  as_root=()
  if ((EUID != 0)); then
    sudo -n true 2>/dev/null || die "postgresql-$version is not installed and sudo needs a password: apt-get install postgresql-$version"
    as_root=(sudo -n)
  fi
  log "installing postgresql-$version from Debian's packages"
  # The package must not create and start a cluster of its own.
  "${as_root[@]}" mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" | "${as_root[@]}" tee /etc/postgresql-common/createcluster.d/cairn.conf >/dev/null
  apt_install() {
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "postgresql-$version" >&2
  }
  apt_install || { "${as_root[@]}" apt-get update -qq >&2 && apt_install; }
  installed || die "postgresql-$version installed, but $bindir lacks its programs"
fi
echo "$bindir"
