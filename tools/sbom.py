#!/usr/bin/env python3
"""A CycloneDX 1.5 JSON SBOM of the release artifacts, from `cargo metadata`.

    sbom.py --version V [--commit SHA] [--time EPOCH] --out FILE \
            ARTIFACT=TARGET:PACKAGE [ARTIFACT=TARGET:PACKAGE ...]

Each ARTIFACT (a file, hashed) is built from the workspace crate PACKAGE for
TARGET (a target triple, or `host`). For each target this asks
`cargo metadata --locked --filter-platform TARGET` and walks the resolve from
the packages named: the crates that go into the artifacts, following normal
dependencies only (proc macros included, since they write code into the
artifact; build scripts' and tests' dependencies excluded). Every crate is one
component: crates.io ones with their purl, licence expression and the
SHA-256 Cargo.lock records for the .crate; workspace crates by name and
version. `dependencies` links the release to its artifacts, each artifact to
its crate and each crate to its dependencies.

Reproducible: the timestamp is --time (the release commit's time), the
serial number a UUID derived from the version and commit, lists are sorted.
Python 3.11 standard library only (tomllib).
"""
import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tomllib
import uuid

CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


def host_triple():
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("host: "):
            return line[len("host: "):]
    raise SystemExit("sbom.py: rustc -vV names no host")


def cargo_metadata(target):
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", target],
        capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"sbom.py: cargo metadata --filter-platform {target}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def lock_checksums(lock_path):
    """(name, version) -> the .crate's SHA-256 that Cargo.lock records."""
    with open(lock_path, "rb") as f:
        lock = tomllib.load(f)
    return {(p["name"], p["version"]): p["checksum"]
            for p in lock.get("package", []) if "checksum" in p}


def closure(metadata, roots):
    """Package ids reached from the workspace packages named `roots` by
    normal dependencies, and each one's normal dependencies (id -> set of ids)."""
    by_name = {}
    for p in metadata["packages"]:
        if p["id"] in metadata["workspace_members"]:
            by_name[p["name"]] = p["id"]
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    edges = {}
    todo = []
    for name in roots:
        if name not in by_name:
            raise SystemExit(f"sbom.py: {name} is not a workspace package")
        todo.append(by_name[name])
    while todo:
        pid = todo.pop()
        if pid in edges:
            continue
        deps = set()
        for dep in nodes[pid]["deps"]:
            if any(k["kind"] is None for k in dep["dep_kinds"]):
                deps.add(dep["pkg"])
        edges[pid] = deps
        todo.extend(deps)
    return edges


def component(package, checksums, workspace):
    """A CycloneDX component for one cargo package, and its bom-ref."""
    name, version = package["name"], package["version"]
    ours = package["id"] in workspace
    ref = f"graceful-wasm:{name}@{version}" if ours else f"pkg:cargo/{name}@{version}"
    c = {"type": "library", "bom-ref": ref, "name": name, "version": version, "scope": "required"}
    if not ours:
        if package.get("source") == CRATES_IO:
            c["purl"] = ref
        if (name, version) in checksums:
            c["hashes"] = [{"alg": "SHA-256", "content": checksums[(name, version)]}]
        if package.get("repository"):
            c["externalReferences"] = [{"type": "vcs", "url": package["repository"]}]
    if package.get("license"):
        # Cargo still reads the old "MIT/Apache-2.0" form as OR; SPDX does not.
        expression = " OR ".join(part.strip() for part in package["license"].split("/"))
        c["licenses"] = [{"expression": expression}]
    if package.get("description"):
        c["description"] = package["description"].strip()
    return ref, c


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def bom(version, commit, timestamp, artifacts, metadata_by_target, checksums):
    """The SBOM as a dict. artifacts: [(path, target, package)];
    metadata_by_target: target -> cargo metadata."""
    components, dependencies = {}, {}
    artifact_refs = []
    for path, target, package in artifacts:
        metadata = metadata_by_target[target]
        workspace = set(metadata["workspace_members"])
        packages = {p["id"]: p for p in metadata["packages"]}
        edges = closure(metadata, [package])
        refs = {}
        for pid in edges:
            refs[pid], c = component(packages[pid], checksums, workspace)
            components.setdefault(refs[pid], c)
        for pid, deps in edges.items():
            dependencies.setdefault(refs[pid], set()).update(refs[d] for d in deps)
        name = os.path.basename(path)
        file_ref = f"file:{name}"
        components[file_ref] = {
            "type": "file", "bom-ref": file_ref, "name": name, "version": version,
            "hashes": [{"alg": "SHA-256", "content": sha256(path)}],
            "properties": [{"name": "graceful-wasm:target", "value": target}],
        }
        root = next(refs[pid] for pid in edges if packages[pid]["name"] == package)
        dependencies[file_ref] = {root}
        artifact_refs.append(file_ref)
    release_ref = f"graceful-wasm@{version}"
    dependencies[release_ref] = set(artifact_refs)
    app = {"type": "application", "bom-ref": release_ref, "name": "graceful-wasm",
           "version": version, "licenses": [{"expression": "Apache-2.0"}]}
    if commit:
        app["properties"] = [{"name": "graceful-wasm:commit", "value": commit}]
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": "urn:uuid:" + str(uuid.uuid5(uuid.NAMESPACE_URL,
                                                    f"graceful-wasm/{version}/{commit or ''}")),
        "version": 1,
        "metadata": {
            "timestamp": datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "graceful-wasm tools/sbom.py"}]},
            "component": app,
        },
        "components": [components[k] for k in sorted(components)],
        "dependencies": [{"ref": k, "dependsOn": sorted(v)} for k, v in sorted(dependencies.items())],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--commit", default="")
    parser.add_argument("--time", type=int, default=0, help="seconds since the epoch")
    parser.add_argument("--lock", default="Cargo.lock")
    parser.add_argument("--out", required=True)
    parser.add_argument("artifacts", nargs="+", metavar="ARTIFACT=TARGET:PACKAGE")
    args = parser.parse_args()
    artifacts = []
    for spec in args.artifacts:
        path, _, built = spec.partition("=")
        target, _, package = built.partition(":")
        if not (path and target and package):
            parser.error(f"{spec}: want ARTIFACT=TARGET:PACKAGE")
        artifacts.append((path, host_triple() if target == "host" else target, package))
    metadata = {t: cargo_metadata(t) for t in sorted({t for _, t, _ in artifacts})}
    doc = bom(args.version, args.commit, args.time, artifacts, metadata, lock_checksums(args.lock))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
