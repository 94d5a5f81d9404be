#!/usr/bin/env python3
"""Packs wasm modules as OCI image layouts that Istio and Envoy Gateway load.

    oci.py [--dist DIR] [--out DIR] [--tag TAG] [--version V] [--revision C] FILTER [FILTER ...]

For each FILTER, reads DIR/FILTER.wasm (--dist, default dist) and writes the
OCI image layout OUT/FILTER/ (--out, default dist/oci): `oci-layout`,
`index.json` (one image manifest, its `org.opencontainers.image.ref.name`
annotation set to TAG, default latest) and `blobs/sha256/`. The image is the
"compat" variant of the Wasm image spec (solo-io/wasm spec/spec-compat.md)
that Istio's and Envoy Gateway's image fetchers accept: an OCI image manifest
whose only (so last) layer is `application/vnd.oci.image.layer.v1.tar+gzip`
holding one regular file, `plugin.wasm`. With --version and --revision the
manifest is annotated `org.opencontainers.image.version` (the version the
build shows, `0.3.0-dev+<commit>` on main, `0.3.0` on a release: the
Makefile's BUILD_VERSION) and `org.opencontainers.image.revision` (the
commit).

Reproducible: the tar entry has mode 0644, uid/gid 0, mtime 0 and no user
names; the gzip member has mtime 0 and no file name; JSON is written with
sorted keys and no spaces; nothing depends on the time or the tag (the tag is
only in index.json). The same .wasm always gives the same manifest digest,
given the same zlib. Prints one line per image: the layout, its ref and the
manifest digest. Python 3 standard library only.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import zlib

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# The image-spec asks for GOARCH/GOOS values: Go names the wasm32-wasip1
# target GOARCH=wasm GOOS=wasip1.
ARCHITECTURE = "wasm"
OS = "wasip1"
ENTRY = "plugin.wasm"
# A tag, as the distribution spec and the ref.name annotation allow it.
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# One path component of an OCI repository name (lower case).
NAME_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def octal(value, width):
    """A ustar numeric field: zero-padded octal digits and a NUL."""
    digits = format(value, "o")
    if len(digits) > width - 1:
        raise SystemExit(f"{value} does not fit a {width}-byte tar field")
    return digits.rjust(width - 1, "0").encode() + b"\0"


def tar_one_file(name, data):
    """A ustar archive with one regular file, owned by 0:0, mode 0644, mtime 0."""
    header = bytearray(512)

    def put(offset, field):
        header[offset:offset + len(field)] = field

    put(0, name.encode())  # name[100]
    put(100, octal(0o644, 8))  # mode
    put(108, octal(0, 8))  # uid
    put(116, octal(0, 8))  # gid
    put(124, octal(len(data), 12))  # size
    put(136, octal(0, 12))  # mtime
    put(148, b" " * 8)  # chksum, counted as spaces
    put(156, b"0")  # typeflag: regular file
    put(257, b"ustar\x0000")  # magic and version; uname, gname stay empty
    put(329, octal(0, 8))  # devmajor
    put(337, octal(0, 8))  # devminor
    put(148, format(sum(header), "06o").encode() + b"\0 ")
    padding = b"\0" * (-len(data) % 512)
    return bytes(header) + data + padding + b"\0" * 1024


def gzip_member(data):
    """One gzip member: no file name, mtime 0, maximum compression."""
    # ID1 ID2, CM=deflate, FLG=0, MTIME=0, XFL=2 (slowest), OS=255 (unknown)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 8)
    body = deflate.compress(data) + deflate.flush()
    trailer = (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "little")
    trailer += (len(data) & 0xFFFFFFFF).to_bytes(4, "little")
    return header + body + trailer


def descriptor(media_type, blob, annotations=None):
    d = {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
    }
    if annotations:
        d["annotations"] = annotations
    return d


def image(name, wasm, version=None, revision=None):
    """The blobs of one image and its manifest's descriptor."""
    tar = tar_one_file(ENTRY, wasm)
    layer = gzip_member(tar)
    config = canonical({
        "architecture": ARCHITECTURE,
        "os": OS,
        "config": {},
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()],
        },
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor(CONFIG, config),
        "layers": [descriptor(LAYER, layer)],
        "annotations": {
            # solo-io/wasm spec-compat.md asks for it with an OCI layer type.
            "module.wasm.image/variant": "compat",
            "org.opencontainers.image.title": name,
            **({"org.opencontainers.image.version": version} if version else {}),
            **({"org.opencontainers.image.revision": revision} if revision else {}),
        },
    })
    return [config, layer, manifest], descriptor(MANIFEST, manifest)


def write_layout(directory, blobs, manifest, tag):
    """Writes a complete layout in a temporary folder, then swaps it in."""
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(directory)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "blobs", "sha256"))
    for blob in blobs:
        digest = hashlib.sha256(blob).hexdigest()
        with open(os.path.join(tmp, "blobs", "sha256", digest), "wb") as f:
            f.write(blob)
    with open(os.path.join(tmp, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))
    entry = dict(manifest, annotations={"org.opencontainers.image.ref.name": tag})
    with open(os.path.join(tmp, "index.json"), "wb") as f:
        f.write(canonical({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry]}))
    shutil.rmtree(directory, ignore_errors=True)
    os.rename(tmp, directory)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dist", default="dist", help="folder with FILTER.wasm (default dist)")
    parser.add_argument("--out", default=os.path.join("dist", "oci"), help="output folder (default dist/oci)")
    parser.add_argument("--tag", default="latest", help="the tag in index.json (default latest)")
    parser.add_argument("--version", help="annotation org.opencontainers.image.version")
    parser.add_argument("--revision", help="annotation org.opencontainers.image.revision (the commit)")
    parser.add_argument("filters", nargs="+", metavar="FILTER")
    args = parser.parse_args(argv)
    if not TAG_RE.fullmatch(args.tag):
        raise SystemExit(f"oci.py: bad tag {args.tag!r}: want {TAG_RE.pattern}")
    for name in args.filters:
        if not NAME_RE.fullmatch(name):
            raise SystemExit(f"oci.py: {name!r} is not a valid OCI repository name component")
        path = os.path.join(args.dist, name + ".wasm")
        try:
            with open(path, "rb") as f:
                wasm = f.read()
        except OSError as e:
            raise SystemExit(f"oci.py: cannot read {path}: {e.strerror} (run `make build` first)")
        if wasm[:4] != b"\0asm":
            raise SystemExit(f"oci.py: {path} is not a wasm module")
        blobs, manifest = image(name, wasm, args.version, args.revision)
        directory = os.path.join(args.out, name)
        write_layout(directory, blobs, manifest, args.tag)
        print(f"{directory} {name}:{args.tag} {manifest['digest']}")


if __name__ == "__main__":
    main(sys.argv[1:])
