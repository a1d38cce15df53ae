#!/usr/bin/env bash
# Creates (once) the Python virtualenv with the moto server, the fake AWS that
# tests talk to over the real wire protocol, keyed by a hash of the pinned
# requirements and of the fixes applied to moto (hack/moto-fixes.py). Prints
# the virtualenv's folder.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

requirements=$CAIRN_ROOT/hack/moto-requirements.txt
fixes=$CAIRN_ROOT/hack/moto-fixes.py
venv=$CAIRN_CACHE/venv/moto-$(cat "$requirements" "$fixes" | sha256sum | cut -c1-12)
mkdir -p "$CAIRN_CACHE"
exec 8>"$CAIRN_CACHE/venv.lock"
flock -w 600 8 || die "another install holds $CAIRN_CACHE/venv.lock"
# The marker is written last, so an interrupted install is redone.
if [[ ! -f "$venv/.complete" ]]; then
  log "creating moto virtualenv in $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
  "$venv/bin/python" "$fixes"
  touch "$venv/.complete"
fi
echo "$venv"
