#!/usr/bin/env python3
"""Prints the executable of each named binary target, one a line, from the JSON
messages of a `cargo test --no-run --message-format=json` build; fails naming
any the build did not make.
  hack/bin-executables.py ARTIFACTS NAME..."""
import json
import sys

artifacts, wanted = sys.argv[1], sys.argv[2:]
found = {}
for line in open(artifacts):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and not m["profile"]["test"] and "bin" in m["target"]["kind"]
            and m["target"]["name"] in wanted):
        found[m["target"]["name"]] = m["executable"]
missing = [w for w in wanted if w not in found]
if missing:
    sys.exit(f"the test build made no executable for {missing}")
print("\n".join(found[w] for w in wanted))
