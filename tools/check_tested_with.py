#!/usr/bin/env python3
"""Checks that every "Tested with graceful-wasm <version>" line (the
examples' READMEs, docs/deploy/) names the workspace version of Cargo.toml:
the suite that verifies an example writes that line when it passes
(harness/src/support/tested_with.rs), so a line naming another version is
an example not yet verified on this one (run its suite, `make test`, and
commit the line). Prints file:line for each and exits 1. `--self-test` runs
it on a small tree with one stale line first. Standard library only.
"""

import os
import re
import sys
import tempfile

from check_report import report

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PLACES = ("examples", os.path.join("docs", "deploy"))
LINE = re.compile(r"Tested with graceful-wasm (\S+)")


def workspace_version(root):
    with open(os.path.join(root, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^\[workspace\.package\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    m = section and re.search(r'^version = "([^"]+)"', section.group(1), re.M)
    if not m:
        sys.exit("check_tested_with: no [workspace.package] version in Cargo.toml")
    return m.group(1)


def check(root):
    """(problems, lines seen)."""
    version = workspace_version(root)
    problems, seen = [], 0
    for place in PLACES:
        for base, dirs, names in os.walk(os.path.join(root, place)):
            dirs.sort()
            for name in sorted(n for n in names if n.endswith(".md")):
                path = os.path.join(base, name)
                with open(path, encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        for m in LINE.finditer(line):
                            seen += 1
                            said = m.group(1).rstrip(".,;:")
                            if said != version:
                                problems.append(
                                    f"{os.path.relpath(path, root)}:{n}: Tested with graceful-wasm {said}, "
                                    f"but the workspace is {version}: run the suite that verifies it "
                                    "(it writes the line) and commit it")
    return problems, seen


def self_test():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "Cargo.toml"), "w") as f:
            f.write('[workspace]\n\n[workspace.package]\nversion = "0.3.0-dev"\n\n[profile.x]\nversion = "9"\n')
        os.makedirs(os.path.join(d, "examples", "a"))
        os.makedirs(os.path.join(d, "docs", "deploy"))
        with open(os.path.join(d, "examples", "a", "README.md"), "w") as f:
            f.write("# A\n\nTested with graceful-wasm 0.3.0-dev on Envoy 1.40.0.\n")
        with open(os.path.join(d, "docs", "deploy", "b.md"), "w") as f:
            f.write("# B\n\nTested with graceful-wasm 0.2.0 on Envoy 1.40.0.\n")
        problems, seen = check(d)
    assert seen == 2, seen
    assert len(problems) == 1 and problems[0].startswith("docs/deploy/b.md:3: Tested with graceful-wasm 0.2.0"), problems
    print("check_tested_with self-test: the stale line is caught, the current one passes")


def main():
    if "--self-test" in sys.argv:
        self_test()
    problems, seen = check(ROOT)
    report(problems,
           f"{len(problems)} example(s) not verified on this version",
           f"{seen} Tested-with line(s) name the workspace version, {workspace_version(ROOT)}")


if __name__ == "__main__":
    main()
