#!/usr/bin/env python3
"""Removes exports from a wasm module: strip_exports.py MODULE NAME [NAME ...]

The proxy-wasm Rust SDK exports every proxy_on_* callback, and Envoy enters
the VM for each exported callback on every stream (a few microseconds each).
A filter that does nothing in a callback should not export it: Envoy then
skips the call. Only the export entry goes; the code stays (unreferenced).
Fails if a named export is missing, so a rename cannot go unnoticed.
"""
import sys


def leb(data, i):
    value, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def enc(value):
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def strip(data, names):
    if data[:4] != b"\0asm":
        raise SystemExit("not a wasm module")
    out, i, found = bytearray(data[:8]), 8, set()
    while i < len(data):
        section, i = data[i], i + 1
        size, i = leb(data, i)
        body = data[i:i + size]
        i += size
        if section == 7:
            count, j = leb(body, 0)
            kept = []
            for _ in range(count):
                start = j
                length, j = leb(body, j)
                name = body[j:j + length].decode()
                j += length + 1  # the name, then the kind byte
                _, j = leb(body, j)  # the index
                if name in names:
                    found.add(name)
                else:
                    kept.append(body[start:j])
            body = enc(len(kept)) + b"".join(kept)
        out += bytes([section]) + enc(len(body)) + body
    missing = set(names) - found
    if missing:
        raise SystemExit(f"no such export: {', '.join(sorted(missing))}")
    return bytes(out)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    path = sys.argv[1]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(strip(data, set(sys.argv[2:])))
