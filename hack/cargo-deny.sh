#!/usr/bin/env bash
# Installs the pinned cargo-deny from crates.io into
# $CAIRN_CACHE/tools/cargo-deny-<version>/ (built once per version) and prints
# the binary's path.
#
# The test command runs `cargo deny check licenses bans sources` (deny.toml);
# `advisories` needs the RustSec database from the internet, so only the
# GitHub workflow runs it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

VERSION=0.20.2
# Built lightly (opt-level 1, no LTO, parallel codegen): 120 s cold instead
# of 181 with cargo-deny's own release profile, and a check of this
# workspace takes 1.5 s either way. The settings are part of the folder's name.
LIGHT=(CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16)
dir=$CAIRN_CACHE/tools/cargo-deny-$VERSION-o1
mkdir -p "$CAIRN_CACHE/tools"
if [[ ! -x $dir/bin/cargo-deny ]]; then
  exec 8>"$CAIRN_CACHE/cargo-deny.lock"
  flock -w 1800 8 || die "another install holds $CAIRN_CACHE/cargo-deny.lock"
  if [[ ! -x $dir/bin/cargo-deny ]]; then
    log "building cargo-deny $VERSION (a cold build takes minutes)"
    start=$SECONDS
    # Its own target folder: the workspace's stays free of it.
    env "${LIGHT[@]}" CARGO_TARGET_DIR="$CAIRN_CACHE/tools/cargo-deny-build" \
      cargo install --quiet --locked --root "$dir.partial" cargo-deny --version "$VERSION" >&2
    rm -rf "$dir" "$CAIRN_CACHE/tools/cargo-deny-build"
    mv "$dir.partial" "$dir"
    log "built cargo-deny in $((SECONDS - start)) s"
  fi
fi
echo "$dir/bin/cargo-deny"
