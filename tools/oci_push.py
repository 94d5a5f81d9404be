#!/usr/bin/env python3
"""Pushes the OCI image layouts `make oci` wrote, never reusing a tag.

    oci_push.py --registry HOST[:PORT]/PATH --tag TAG [--flags="SKOPEO COPY FLAGS"] FILTER...

For each FILTER, the layout dist/oci/FILTER (--oci) holds one image manifest
tagged TAG. First every REGISTRY/FILTER:TAG is looked up (`skopeo inspect
--raw`, with the --dest-* flags of --flags as their inspect counterparts):

- absent: it will be pushed;
- present with the same manifest digest: already pushed, left alone;
- present with another digest: the tag belongs to another build, and nothing
  at all is pushed (exit 1): tags are never reused, so the fix is a new
  version (docs/releasing.md);
- the registry cannot say (unreachable, unauthorised): nothing is pushed.

Then the absent ones are pushed with `skopeo copy --preserve-digests`, one
line each: `pushed REGISTRY/FILTER:TAG@DIGEST`.
Python 3 standard library only.
"""
import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile

# What skopeo prints when the registry answers that the tag (MANIFEST_UNKNOWN)
# or the whole repository (NAME_UNKNOWN) does not exist.
ABSENT = ("manifest unknown", "name unknown", "repository name not known")
# skopeo copy's --dest-X flags that take a value in the next argument.
VALUED = {"creds", "authfile", "cert-dir", "registry-token", "username", "password"}


class Refused(Exception):
    pass


def inspect_flags(copy_flags):
    """skopeo copy's --dest-X flags as skopeo inspect's --X (the other copy
    flags have no meaning for a lookup)."""
    out, args = [], list(copy_flags)
    while args:
        flag = args.pop(0)
        if not flag.startswith("--dest-"):
            continue
        name = flag[len("--dest-"):]
        out.append("--" + name)
        if "=" not in name and name in VALUED and args:
            out.append(args.pop(0))
    return out


def local_digest(layout, tag):
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    for m in index.get("manifests", []):
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return m["digest"]
    raise Refused(f"{layout} has no image tagged {tag}: run make oci TAG={tag}")


def remote_digest(image, flags):
    """The digest of the manifest the registry holds under image, or None."""
    out = subprocess.run(["skopeo", "inspect", "--raw", *flags, f"docker://{image}"],
                         capture_output=True, check=False)
    if out.returncode == 0:
        return "sha256:" + hashlib.sha256(out.stdout).hexdigest()
    error = out.stderr.decode(errors="replace").strip()
    if any(a in error.lower() for a in ABSENT):
        return None
    raise Refused(f"cannot tell whether {image} exists, so nothing is pushed: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--flags", default="", help="skopeo copy flags (PUSH_FLAGS), as one argument: --flags=...")
    parser.add_argument("--oci", default="dist/oci")
    parser.add_argument("filters", nargs="+")
    args = parser.parse_args()
    copy_flags = shlex.split(args.flags)
    lookup_flags = inspect_flags(copy_flags)

    try:
        plan = []
        for f in args.filters:
            image = f"{args.registry}/{f}:{args.tag}"
            ours = local_digest(os.path.join(args.oci, f), args.tag)
            theirs = remote_digest(image, lookup_flags)
            if theirs is not None and theirs != ours:
                raise Refused(
                    f"{image} already holds {theirs}; this build is {ours}. A tag is never reused: "
                    "bump [workspace.package] version in Cargo.toml (or give another TAG) and push "
                    "that (docs/releasing.md). Nothing was pushed.")
            plan.append((f, image, ours, theirs is not None))
        with tempfile.NamedTemporaryFile() as digestfile:
            for f, image, ours, there in plan:
                if there:
                    print(f"already pushed {image}@{ours} (same digest)")
                    continue
                layout = os.path.join(args.oci, f)
                copy = subprocess.run(
                    ["skopeo", "copy", "--quiet", "--preserve-digests", "--digestfile",
                     digestfile.name, *copy_flags, f"oci:{layout}:{args.tag}", f"docker://{image}"],
                    check=False)
                if copy.returncode != 0:
                    raise Refused(f"skopeo copy to {image} failed (exit {copy.returncode})")
                with open(digestfile.name) as d:
                    print(f"pushed {image}@{d.read().strip()}")
    except Refused as e:
        print(f"make push: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
