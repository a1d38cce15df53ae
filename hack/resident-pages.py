#!/usr/bin/env python3
"""Where a running process's resident memory lies: by mapping, by section of
its executable, and its resident code by crate (from the symbol table).

    hack/resident-pages.py PID [BINARY]

BINARY is the executable with its symbols when /proc/PID/exe is not readable
from here (a process in a container: pass the same build from the cargo
target). Reads /proc/PID/pagemap, so it runs as root. An idle controller's
RSS is mostly code pages the kernel mapped around the ones it ran; this shows
which ones, to judge what a smaller build would save.
"""
import bisect
import collections
import os
import re
import struct
import subprocess
import sys

PAGE = 4096


def mappings(pid):
    for line in open(f"/proc/{pid}/maps"):
        parts = line.split()
        if len(parts) < 5 or (len(parts) > 5 and parts[5] == "[vsyscall]"):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        yield lo, hi, parts[1], int(parts[2], 16), parts[5] if len(parts) > 5 else ""


def present_pages(pagemap, lo, hi):
    """The addresses of the pages of [lo, hi) mapped in the process."""
    pagemap.seek(lo // PAGE * 8)
    data = pagemap.read((hi - lo) // PAGE * 8)
    return [lo + i * PAGE for i in range(len(data) // 8)
            if struct.unpack_from("<Q", data, i * 8)[0] >> 63]


def sections(binary):
    """(name, address, file offset, size) of each allocated section of `binary`."""
    out = subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout
    for m in re.finditer(r"\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", out):
        if int(m[2], 16):
            yield m[1], int(m[2], 16), int(m[3], 16), int(m[4], 16)


def code_symbols(binary):
    out = subprocess.run(["nm", "-C", "--defined-only", "-S", binary],
                         capture_output=True, text=True, check=True).stdout
    symbols = []
    for m in re.finditer(r"^([0-9a-f]+) ([0-9a-f]+) [tTwW] (.*)$", out, re.M):
        symbols.append((int(m[1], 16), int(m[2], 16), m[3]))
    return sorted(symbols)


def crate(symbol):
    m = re.match(r"[<_&*\s]*(?:dyn )?([A-Za-z_][A-Za-z0-9_]*)::", symbol)
    return m[1] if m else "(C or unnamed)"


def main():
    pid = int(sys.argv[1])
    exe = os.readlink(f"/proc/{pid}/exe")
    binary = sys.argv[2] if len(sys.argv) > 2 else exe
    pagemap = open(f"/proc/{pid}/pagemap", "rb")
    maps = list(mappings(pid))
    by_mapping = collections.Counter()
    exe_pages = {}  # file offset -> resident, for the executable's mappings
    for lo, hi, perm, offset, path in maps:
        present = present_pages(pagemap, lo, hi)
        by_mapping[(os.path.basename(path) or "[anonymous]", perm)] += len(present)
        if path == exe:
            for address in present:
                exe_pages[offset + address - lo] = True
    print("resident by mapping (MiB):")
    for (name, perm), pages in by_mapping.most_common(10):
        print(f"  {pages * PAGE / 2**20:7.2f}  {perm} {name}")

    print(f"resident by section of {os.path.basename(binary)} (MiB):")
    text = None
    for name, address, offset, size in sections(binary):
        first, last = offset // PAGE * PAGE, offset + size
        pages = [p for p in range(first, last, PAGE) if p in exe_pages]
        if size >= 64 * 1024:
            print(f"  {len(pages) * PAGE / 2**20:7.2f} of {size / 2**20:6.2f}  {name}")
        if name == ".text":
            # Symbols are by address: the pages' addresses in the file's layout.
            text = [p - offset + address for p in pages]

    if text:
        symbols = code_symbols(binary)
        starts = [s[0] for s in symbols]
        by_crate = collections.Counter()
        for page in text:
            i = max(bisect.bisect_right(starts, page) - 1, 0)
            while i < len(symbols) and symbols[i][0] < page + PAGE:
                start, size, name = symbols[i]
                overlap = min(start + size, page + PAGE) - max(start, page)
                if overlap > 0:
                    by_crate[crate(name)] += overlap
                i += 1
        print("resident code by crate (MiB):")
        for name, size in by_crate.most_common(20):
            print(f"  {size / 2**20:7.2f}  {name}")


if __name__ == "__main__":
    main()
