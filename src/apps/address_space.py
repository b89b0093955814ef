"""Writes how much address space the dynamic loader maps for a program and its libraries.

Used at build time beside each binary (CMakeLists.txt): the binary's front (src/apps/launcher.cpp)
compares it with the process's address-space limit (ulimit -v) before the loader runs. For each
ELF object `ldd` lists, the loader reserves one span from its first loadable segment's page to its
last segment's end; the sum of those spans is what has to fit under the limit.

usage: address_space.py PROGRAM OUT
OUT: "<bytes> total", then "<bytes> <file name>" per object, largest first.
"""
import os
import re
import struct
import subprocess
import sys

PAGE = 4096
PT_LOAD = 1


def mapped_span(path):
    """Bytes from the first loadable segment's page to the page after the last one's end."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise SystemExit(f"address_space.py: {path} is not a 64-bit little-endian ELF file")
        (phoff,) = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    first, last = None, 0
    for i in range(phnum):
        p_type, _, _, vaddr, _, _, memsz, _ = struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
        if p_type != PT_LOAD:
            continue
        start = vaddr & ~(PAGE - 1)
        first = start if first is None else min(first, start)
        last = max(last, (vaddr + memsz + PAGE - 1) & ~(PAGE - 1))
    return 0 if first is None else last - first


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    program, out = sys.argv[1], sys.argv[2]
    listing = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    # "libx.so => /path/libx.so (0x...)" and the loader's own "/lib64/ld-linux-x86-64.so.2 (0x...)";
    # "not found" lines and the vDSO have no path.
    objects = [program] + re.findall(r"=> (/\S+) \(", listing)
    objects += re.findall(r"^\s*(/\S+) \(", listing, re.M)
    spans = sorted(((mapped_span(p), os.path.basename(p)) for p in set(objects)), reverse=True)
    lines = [f"{sum(s for s, _ in spans)} total"] + [f"{s} {name}" for s, name in spans]
    with open(out + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
