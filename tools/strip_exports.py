#!/usr/bin/env python3
"""Keeps only the callbacks a module declares: strip_exports.py MANIFEST MODULE [CALLBACK...]

The proxy-wasm Rust SDK exports every proxy_on_* callback, and Envoy enters
the VM for each exported callback on every stream (a few microseconds each).
A filter that does nothing in a callback should not export it: Envoy then
skips the call. So each filter declares, beside its code in its Cargo.toml
(MANIFEST), the callbacks it acts in:

    [package.metadata.proxy-wasm]
    callbacks = ["proxy_on_request_headers", "proxy_on_log"]

and this removes from MODULE (in place) every other proxy_on_* export except
LIFECYCLE, which every module needs, and any CALLBACK named after MODULE
(`make bench-prices` keeps one more in the floor to price a VM entry). Exports that are not callbacks (memory,
_initialize, proxy_abi_version_*) stay. Only the export entry goes; the code
stays (unreferenced). Fails if a declared or lifecycle callback is not
exported, so a rename or a typo cannot go unnoticed.
"""
import json
import os
import subprocess
import sys

# The host calls these in every module whatever the filter does: to copy
# data into the VM, to create and delete contexts, and to start the VM and
# hand it the plugin configuration.
LIFECYCLE = {
    "proxy_on_memory_allocate",
    "proxy_on_context_create",
    "proxy_on_delete",
    "proxy_on_vm_start",
    "proxy_on_configure",
}


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


def keep_only(data, keep):
    """The module with every proxy_on_* export not in `keep` removed."""
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
                found.add(name)
                if name in keep or not name.startswith("proxy_on_"):
                    kept.append(body[start:j])
            body = enc(len(kept)) + b"".join(kept)
        out += bytes([section]) + enc(len(body)) + body
    missing = keep - found
    if missing:
        raise SystemExit(f"no such export: {', '.join(sorted(missing))}")
    return bytes(out)


def declared(manifest):
    """`[package.metadata.proxy-wasm] callbacks` of a Cargo.toml."""
    try:
        import tomllib  # Python 3.11+

        with open(manifest, "rb") as f:
            package = tomllib.load(f).get("package", {})
    except ImportError:
        # Older Pythons: Cargo reads its own manifest.
        meta = json.loads(subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--manifest-path", manifest],
            check=True, capture_output=True, text=True).stdout)
        wanted = os.path.realpath(manifest)
        package = next(p for p in meta["packages"] if os.path.realpath(p["manifest_path"]) == wanted)
    callbacks = (package.get("metadata") or {}).get("proxy-wasm", {}).get("callbacks")
    if not isinstance(callbacks, list) or not all(
            isinstance(c, str) and c.startswith("proxy_on_") for c in callbacks):
        raise SystemExit(f"{manifest}: [package.metadata.proxy-wasm] callbacks must be a list of proxy_on_* names")
    return set(callbacks)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    manifest, path, *extra = sys.argv[1:]
    keep = LIFECYCLE | declared(manifest) | set(extra)
    with open(path, "rb") as f:
        stripped = keep_only(f.read(), keep)
    # Written only once stripping succeeded: a refusal leaves the module as it was.
    with open(path, "wb") as f:
        f.write(stripped)
