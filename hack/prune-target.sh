#!/usr/bin/env bash
# Deletes the test executables of earlier builds from the cargo target folder.
# Cargo never removes them: each build of a test binary at a new hash (a
# changed source, another clone's path, other features) leaves the old one,
# about 100-200 MB each, and clones sharing the cache filled the host's disk
# (cairn-instance's own low-disk guard then failed tests). Kept: the
# executables ARTIFACTS names (the JSON messages of the build just made).
#   hack/prune-target.sh ARTIFACTS
set -euo pipefail
source "$(dirname "$0")/lib.sh"

"$CAIRN_ROOT/hack/artifacts.py" tests "$1" | cut -f3 | python3 -c '
import os, re, sys
current, folders = set(), set()
for line in sys.stdin:
    executable = line.rstrip("\n")
    current.add(os.path.realpath(executable))
    folders.add(os.path.dirname(executable))
names = {re.sub(r"-[0-9a-f]{16}$", "", os.path.basename(p)) for p in current}
freed = removed = 0
for folder in folders:
    for entry in os.scandir(folder):
        stem, dot, extension = entry.name.partition(".")
        base = re.sub(r"-[0-9a-f]{16}$", "", stem)
        if base == stem or base not in names or extension not in ("", "d", "dwp"):
            continue
        executable = os.path.realpath(os.path.join(folder, stem))
        if executable in current or not entry.is_file(follow_symlinks=False):
            continue
        freed += entry.stat().st_size
        removed += 1
        os.remove(entry.path)
if removed:
    print(f"[cairn] pruned {removed} files of older test builds ({freed / 2**30:.1f} GiB)", file=sys.stderr)
'
