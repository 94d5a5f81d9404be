#!/usr/bin/env python3
"""The steps of `make release` (docs/releasing.md), run from the repository root.

    release.py check --version V [--tag TAG]
        Refuses (exit 1, saying why) unless: V is a semantic version; V is
        not a development version (no `dev` in its pre-release part, as
        `0.3.0-dev` on main); TAG, if given, is V (a release's images are
        tagged with its version); the work tree is clean (no change, no
        untracked file); the git tag vV does not exist, or names HEAD;
        CHANGELOG.md has a dated `## [V] - YYYY-MM-DD` section whose every
        entry says **Breaking** or **Not breaking** (docs/releasing.md's rule).
    release.py assemble --version V --dist DIR --out DIR FILTER...
        Fills OUT (emptied first) with the artifacts `make oci native` left
        in DIST: FILTER.wasm, libgraceful.so, FILTER.oci.tar (the OCI image
        layout DIST/oci/FILTER, tagged V, as one reproducible tar that
        `skopeo copy oci-archive:FILTER.oci.tar:V ...` reads), the JSON
        schemas schema/*.json if there are any, RELEASE_NOTES.md (V's section
        of CHANGELOG.md), sbom.cdx.json (tools/sbom.py) and SHA256SUMS
        (`sha256sum -c SHA256SUMS` checks them). Prints the list with checksums.
    release.py tag --version V
        Checks again, then creates the annotated tag vV on HEAD (if it is not
        there already) and prints how to push it.
    release.py push-check --version V --tag TAG
        `make push`'s guard: refuses (exit 1, one line) to push images tagged
        with a release version V (TAG is V) from a commit the tag vV does not
        name. A development version (`0.3.0-dev`) or another TAG passes.
Python 3.11 standard library only.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbom  # noqa: E402

# Semantic Versioning 2.0.0's grammar, without build metadata (a tag names one build).
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?")
NATIVE = "libgraceful.so"
NATIVE_PACKAGE = "graceful-native"
SUMS = "SHA256SUMS"
# A dated changelog heading: `## [0.3.0] - 2027-01-15`.
DATED = r" - \d{4}-\d{2}-\d{2}\s*$"


def development(version):
    """Whether the version is a development one: `dev` among its
    pre-release identifiers (`0.3.0-dev`, `0.3.0-dev.2`). Such a version is
    what main carries between releases; it is never released."""
    m = SEMVER.fullmatch(version)
    pre = (m.group(4) or "")[1:] if m else ""
    return any(part.startswith("dev") for part in pre.split(".") if part)


class Refused(Exception):
    """The release must not go on; the message says why and what to do."""


def git(*args, check=True):
    out = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise Refused(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip() if out.returncode == 0 else None


def tag_name(version):
    return f"v{version}"


def tagged_commit(tag):
    """The commit the tag names, or None if there is no such tag."""
    return git("rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}", check=False)


def changelog_heading(version, path="CHANGELOG.md"):
    """The `## [version]...` heading line, or None."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    m = re.search(rf"^## \[{re.escape(version)}\][^\n]*$", text, re.M)
    return m.group(0) if m else None


def changelog_section(version, path="CHANGELOG.md"):
    """The text under `## [version]` up to the next `## ` heading, or None."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    heading = re.compile(rf"^## \[{re.escape(version)}\][^\n]*\n", re.M)
    m = heading.search(text)
    if not m:
        return None
    end = re.compile(r"^## ", re.M).search(text, m.end())
    body = text[m.end():end.start() if end else len(text)]
    # Link definitions ([0.2.0]: https://...) belong to the whole file.
    body = re.sub(r"^\[[^\]]+\]: \S+\n?", "", body, flags=re.M)
    return text[m.start():m.end()] + body.strip() + "\n"


CLASSIFIED = re.compile(r"- \*\*(Breaking|Not breaking)\*\*")


def unclassified(section):
    """The entries (top-level `- ` items) of a changelog section that do not
    start with **Breaking** or **Not breaking**: their first lines."""
    return [line for line in section.splitlines()
            if line.startswith("- ") and not CLASSIFIED.match(line)]


def check(version, tag=None):
    """Every reason to refuse the release, or nothing."""
    if not SEMVER.fullmatch(version):
        raise Refused(f"{version!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRE]): "
                      "fix [workspace.package] version in Cargo.toml")
    if development(version):
        raise Refused(f"{version} is a development version (pre-release `dev`), not a release: "
                      "set [workspace.package] version in Cargo.toml to the release's number "
                      "and date its CHANGELOG.md section first (docs/releasing.md)")
    if tag is not None and tag != version:
        raise Refused(f"TAG={tag}, but a release is tagged with its version, {version}: "
                      "run make release without TAG")
    dirty = git("status", "--porcelain", "--untracked-files=normal")
    if dirty:
        lines = dirty.splitlines()
        shown = "\n  ".join(lines[:10]) + (f"\n  ... and {len(lines) - 10} more" if len(lines) > 10 else "")
        raise Refused("the work tree is not clean; a release is built from a commit only "
                      f"(commit or stash these):\n  {shown}")
    head = git("rev-parse", "HEAD")
    tagged = tagged_commit(tag_name(version))
    if tagged is not None and tagged != head:
        raise Refused(f"the tag {tag_name(version)} already names {tagged[:12]}, not HEAD "
                      f"({head[:12]}): version {version} is released; a version is never "
                      "reused, so bump [workspace.package] version in Cargo.toml (docs/releasing.md)")
    heading = changelog_heading(version)
    if heading is None:
        raise Refused(f"CHANGELOG.md has no `## [{version}]` section: write what changed "
                      "for users first (docs/releasing.md)")
    if not re.search(DATED, heading[len(f"## [{version}]"):]):
        raise Refused(f"CHANGELOG.md's `{heading.strip()}` has no date: write it as "
                      f"`## [{version}] - YYYY-MM-DD` (docs/releasing.md)")
    loose = unclassified(changelog_section(version))
    if loose:
        raise Refused(f"{len(loose)} entr{'y' if len(loose) == 1 else 'ies'} of CHANGELOG.md's "
                      f"`## [{version}]` say neither **Breaking** nor **Not breaking** "
                      f"(docs/releasing.md), the first: {loose[0][:80]}")
    return head


def push_check(version, tag):
    """Refuses to push images under a release number (`X.Y.Z`) from any
    commit but the one its tag names, whatever the workspace version: TAG=0.2.0
    on a development tree would publish unreleased code as 0.2.0."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", tag):
        return
    head = git("rev-parse", "HEAD")
    tagged = tagged_commit(tag_name(tag))
    if tagged != head:
        where = f"names {tagged[:12]}" if tagged else "does not exist"
        kind = "a release" if tag == version else f"a release number (this tree is {version})"
        raise Refused(f"version {tag} is {kind}, but HEAD ({head[:12]}) is not its tag "
                      f"{tag_name(tag)} (which {where}): push a release from its tag "
                      f"(make release creates it), or give TAG=<another tag>")


def oci_archive(layout, out):
    """The OCI image layout folder as one tar: sorted entries, owner 0:0,
    mtime 0, no user names, so the same layout always gives the same bytes."""
    def clean(info):
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tar:
        for root, dirs, files in os.walk(layout):
            dirs.sort()
            rel_root = os.path.relpath(root, layout)
            if rel_root != ".":
                tar.add(root, arcname=rel_root, recursive=False, filter=clean)
            for name in sorted(files):
                path = os.path.join(root, name)
                arcname = name if rel_root == "." else os.path.join(rel_root, name)
                tar.add(path, arcname=arcname, recursive=False, filter=clean)


def layout_tag(layout):
    """The ref.name of the layout's only manifest (tools/oci.py writes one)."""
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    refs = [m.get("annotations", {}).get("org.opencontainers.image.ref.name")
            for m in index.get("manifests", [])]
    return refs[0] if len(refs) == 1 else None


def assemble(version, dist, out, filters, schema_dir="schema", lock="Cargo.lock",
             changelog="CHANGELOG.md"):
    """Writes the release folder; returns [(name, sha256, size)] in SHA256SUMS order."""
    needed = [os.path.join(dist, f"{f}.wasm") for f in filters]
    needed += [os.path.join(dist, NATIVE)] + [os.path.join(dist, "oci", f) for f in filters]
    missing = [p for p in needed if not os.path.exists(p)]
    if missing:
        raise Refused(f"missing: {', '.join(missing)} (make release builds them: make oci native)")
    for f in filters:
        tag = layout_tag(os.path.join(dist, "oci", f))
        if tag != version:
            raise Refused(f"{dist}/oci/{f} is tagged {tag!r}, not {version}: make oci TAG={version}")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)

    built = []  # (file, target, package) for the SBOM
    for f in filters:
        package = f.replace("_", "-")
        shutil.copyfile(os.path.join(dist, f"{f}.wasm"), os.path.join(out, f"{f}.wasm"))
        oci_archive(os.path.join(dist, "oci", f), os.path.join(out, f"{f}.oci.tar"))
        built += [(os.path.join(out, f"{f}.wasm"), "wasm32-wasip1", package),
                  (os.path.join(out, f"{f}.oci.tar"), "wasm32-wasip1", package)]
    shutil.copyfile(os.path.join(dist, NATIVE), os.path.join(out, NATIVE))
    built.append((os.path.join(out, NATIVE), sbom.host_triple(), NATIVE_PACKAGE))
    for schema in sorted(glob.glob(os.path.join(schema_dir, "*.json"))):
        shutil.copyfile(schema, os.path.join(out, os.path.basename(schema)))
    notes = changelog_section(version, changelog)
    if notes:
        with open(os.path.join(out, "RELEASE_NOTES.md"), "w") as fh:
            fh.write(notes)

    commit = git("rev-parse", "HEAD", check=False) or ""
    when = int(git("show", "-s", "--format=%ct", "HEAD", check=False) or 0)
    metadata = {t: sbom.cargo_metadata(t) for t in sorted({t for _, t, _ in built})}
    doc = sbom.bom(version, commit, when, built, metadata, sbom.lock_checksums(lock))
    with open(os.path.join(out, "sbom.cdx.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")

    listed = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if name != SUMS and os.path.isfile(path):
            listed.append((name, sbom.sha256(path), os.path.getsize(path)))
    with open(os.path.join(out, SUMS), "w") as fh:
        # sha256sum's format: hash, two spaces (text mode), name.
        fh.writelines(f"{digest}  {name}\n" for name, digest, _ in listed)
    return listed


def tag_commands(version):
    tag = tag_name(version)
    return (f'git tag -a {tag} -m "graceful-wasm {version}"', f"git push origin {tag}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("check")
    p.add_argument("--version", required=True)
    p.add_argument("--tag")
    p = sub.add_parser("assemble")
    p.add_argument("--version", required=True)
    p.add_argument("--dist", default="dist")
    p.add_argument("--out", required=True)
    p.add_argument("--schema-dir", default="schema")
    p.add_argument("filters", nargs="+")
    sub.add_parser("tag").add_argument("--version", required=True)
    p = sub.add_parser("push-check")
    p.add_argument("--version", required=True)
    p.add_argument("--tag", required=True)
    args = parser.parse_args()

    try:
        if args.step == "check":
            head = check(args.version, args.tag)
            print(f"release {args.version}: clean tree at {head[:12]}, CHANGELOG.md has its section, "
                  f"tag {tag_name(args.version)} " +
                  ("names HEAD" if tagged_commit(tag_name(args.version)) else "not yet created"))
        elif args.step == "assemble":
            listed = assemble(args.version, args.dist, args.out, args.filters, args.schema_dir)
            commit = git("rev-parse", "HEAD", check=False) or "?"
            print(f"graceful-wasm {args.version} (commit {commit[:12]}): {args.out}/")
            width = max(len(name) for name, _, _ in listed)
            for name, digest, size in listed:
                print(f"  {name:<{width}}  {size:>9} B  sha256:{digest}")
            print(f"  {SUMS} (check: cd {args.out} && sha256sum -c {SUMS})")
        elif args.step == "tag":
            head = check(args.version)
            tag = tag_name(args.version)
            if tagged_commit(tag) == head:
                print(f"{tag} already names HEAD ({head[:12]})")
            else:
                git("tag", "-a", tag, "-m", f"graceful-wasm {args.version}")
                print(f"tagged {tag} at {head[:12]}")
            print(f"publish it: {tag_commands(args.version)[1]}")
        else:
            push_check(args.version, args.tag)
    except Refused as e:
        print(f"make {'push' if args.step == 'push-check' else 'release'}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
