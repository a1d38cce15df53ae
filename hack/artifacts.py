#!/usr/bin/env python3
"""What a `cargo test --no-run --message-format=json` build made, from its
JSON messages (ARTIFACTS):

  hack/artifacts.py bins ARTIFACTS NAME...
      the executable of each named binary target, one a line; fails naming
      any the build did not make (the images' binaries, the plugin's);
  hack/artifacts.py tests ARTIFACTS
      one line per test executable: its key (package folder and target, a
      crate's own unit tests as `<target> (unit)`), its package folder
      (relative to the repository) and its path, tab-separated
      (hack/run-tests.sh's binaries, hack/prune-target.sh's keep list)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def artifacts(path):
    for line in open(path):
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") == "compiler-artifact" and message.get("executable"):
            yield message


def bins(path, wanted):
    found = {}
    for m in artifacts(path):
        target = m["target"]
        if not m["profile"]["test"] and "bin" in target["kind"] and target["name"] in wanted:
            found[target["name"]] = m["executable"]
    missing = [w for w in wanted if w not in found]
    if missing:
        sys.exit(f"the test build made no executable for {missing}")
    print("\n".join(found[w] for w in wanted))


def tests(path):
    for m in artifacts(path):
        if not m["profile"]["test"]:
            continue
        folder = os.path.relpath(os.path.dirname(m["manifest_path"]), ROOT)
        target = m["target"]
        name = target["name"] if "test" in target["kind"] else f"{target['name']} (unit)"
        print(f"{folder}/{name}\t{folder}\t{m['executable']}")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "bins":
        bins(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 3 and sys.argv[1] == "tests":
        tests(sys.argv[2])
    else:
        sys.exit(__doc__)
