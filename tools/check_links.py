#!/usr/bin/env python3
"""Checks every relative link in the repository's Markdown files (README.md,
the book under docs/, the examples' READMEs; not target/, .venv/ or .git/):
the file or folder it names exists, and a `#anchor` into a Markdown file (or
into the same one) names one of its headings or HTML ids. Anchors are slugged
as GitHub and mdBook both slug a heading: its text without markup, lower
case, every letter, digit, `_` and `-` kept, whitespace turned into `-`,
anything else dropped; a repeated slug gets `-1`, `-2`, ... Links in code
(fenced blocks and `inline spans`) and absolute URLs are not links.
A link's text may span lines. Prints file:line for each broken link and
exits 1; so does a run that finds no relative link to check. `--self-test`
runs it on a small tree with known faults first. Standard library only, so
it runs without mdBook: `python3 tools/check_links.py`.
"""

import os
import re
import sys
import tempfile

from check_report import report

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# Folders that hold no Markdown of ours: build outputs, installed tools.
SKIPPED = {".git", "target", ".venv", "node_modules"}

FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
# A code span: within one paragraph (it may cross a line break, never a blank line).
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.S)
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ATTR = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*\"([^\"]*)\"", re.I)
HTML_ID = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
# A changelog's comparison links, relative to the forge's page of the file
# (`../../compare/v1...v2`, `../../releases/tag/v1` from the root): the
# repository's public URL is recorded nowhere, and the forge resolves these.
FORGE_LINK = re.compile(r"^\.\./\.\./(compare/v\S+\.\.\.\S+|releases/tag/v\S+)$")


def slug(text):
    """A heading's anchor as GitHub and mdBook (0.5, `id_from_content`) make it."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "_-":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def prose(text):
    """The text with fenced code blocks and `code spans` blanked (newlines kept,
    so offsets still give line numbers): code holds no links."""
    out = []
    fence = None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        out.append(line)
    # A code span may cross a line break, as a link's text may.
    return CODE_SPAN.sub(lambda s: re.sub(r"[^\n]", " ", s.group(0)), "\n".join(out))


def anchors(path, cache={}):
    """Every anchor a Markdown file offers: its headings' slugs and HTML ids."""
    if path not in cache:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fence = None
        for n, line in enumerate(text.splitlines(), 1):
            m = FENCE.match(line)
            if fence:
                if m and m.group(1)[0] == fence[0]:
                    fence = None
                continue
            if m:
                fence = m.group(1)
                continue
            h = HEADING.match(line)
            if h:
                base = slug(h.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                found.add(base if k == 0 else f"{base}-{k}")
            found.update(HTML_ID.findall(line))
        cache[path] = found
    return cache[path]


def links(text):
    """(line number, target) of every link in prose; a link's text may span lines."""
    body = prose(text)

    def line_of(offset):
        return body.count("\n", 0, offset) + 1

    for m in INLINE_LINK.finditer(body):
        yield line_of(m.start()), m.group(1)
    for m in HTML_ATTR.finditer(body):
        yield line_of(m.start()), m.group(1)
    for n, line in enumerate(body.split("\n"), 1):
        m = REFERENCE_DEF.match(line)
        if m:
            yield n, m.group(1)


def check_file(root, rel):
    """(problems, how many relative links were checked) for one file."""
    problems, checked = [], 0
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for n, target in links(text):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue
        if rel == "CHANGELOG.md" and FORGE_LINK.match(target):
            continue
        checked += 1
        where, _, anchor = target.partition("#")
        where = re.sub(r"\?.*$", "", where)
        if where.startswith("/"):
            problems.append(f"{rel}:{n}: {target}: a root-relative link resolves on no host the same way; use a relative one")
            continue
        dest = os.path.normpath(os.path.join(os.path.dirname(path), where)) if where else path
        if not os.path.exists(dest):
            problems.append(f"{rel}:{n}: {target}: no such file or folder")
            continue
        if anchor and os.path.isfile(dest) and dest.endswith(".md") and anchor not in anchors(dest):
            problems.append(f"{rel}:{n}: {target}: no heading or id #{anchor} in {os.path.relpath(dest, root)}")
    return problems, checked


def markdown_files(root):
    """Every Markdown file under root, README.md first, in a stable order."""
    files = []
    for base, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        for name in sorted(names):
            if name.endswith(".md"):
                files.append(os.path.relpath(os.path.join(base, name), root))
    return files


def check(root):
    """(problems, links checked) over every file. Checking no link at all is
    itself a problem: the files were not found, or nothing was read as a link."""
    problems, checked = [], 0
    files = markdown_files(root)
    for rel in files:
        p, n = check_file(root, rel)
        problems.extend(p)
        checked += n
    if checked == 0:
        problems.append(f"no relative link found in {len(files)} Markdown file(s) under {root}: nothing was checked")
    return problems, checked


def self_test():
    """A good tree passes; each kind of broken link is caught, and code is not read as links."""
    empty = tempfile.mkdtemp()
    with open(os.path.join(empty, "README.md"), "w", encoding="utf-8") as f:
        f.write("# no links\n\n`[code](not-a-link.md)`\n")
    nothing, checked = check(empty)
    assert checked == 0 and len(nothing) == 1 and "nothing was checked" in nothing[0], nothing
    d = tempfile.mkdtemp()

    def write(rel, text):
        os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
        with open(os.path.join(d, rel), "w", encoding="utf-8") as f:
            f.write(text)

    write("README.md", "# graceful-wasm\n\nSee [the gate](docs/gate.md#the-drain-gate-without-compare-and-swap),\n"
          "[twice](docs/gate.md#budgets-1), [`make demo`](#the-main-job-make-demo), [a folder](docs/),\n"
          "[web](https://example.org/x#y) and ![chart](docs/chart.svg).\n\n"
          "## The main job: `make demo`\n\n```sh\n[not a link](nowhere.md)\n```\n\n`[not a link](nowhere.md)`, and `a span\n"
          "[across lines](nowhere.md)`\n")
    write("docs/gate.md", "# The drain gate without compare-and-swap\n\n## Budgets\n\n## Budgets\n\n"
          "## graceful_drain × Envoy 1.36\n\n[up](../README.md#graceful-wasm), [ref][r], "
          "[minor](#graceful_drain--envoy-136)\n\n[r]: ../README.md\n")
    write("docs/chart.svg", "<svg/>")
    good, checked = check(d)
    assert good == [] and checked == 8, (good, checked)
    write("docs/bad.md", "[gone](missing.md), [no anchor](gate.md#budgets-2), [self](#nope),\n"
          "[root](/docs/gate.md), <a href=\"../nowhere.txt\">x</a>, [ref]: also-missing.md\n\n"
          "[r2]: ./missing-too.md\n\nA link whose text [spans\ntwo lines](gone-too.md).\n")
    bad, _ = check(d)
    expected = [
        "docs/bad.md:1: missing.md: no such file or folder",
        "docs/bad.md:1: gate.md#budgets-2: no heading or id #budgets-2 in docs/gate.md",
        "docs/bad.md:1: #nope: no heading or id #nope in docs/bad.md",
        "docs/bad.md:2: /docs/gate.md: a root-relative link",
        "docs/bad.md:2: ../nowhere.txt: no such file or folder",
        "docs/bad.md:4: ./missing-too.md: no such file or folder",
        "docs/bad.md:6: gone-too.md: no such file or folder",
    ]
    for e in expected:
        assert any(p.startswith(e) for p in bad), (e, bad)
    assert len(bad) == len(expected), bad
    print("check_links self-test: a good tree passes; a missing file, a missing anchor (same and other file), "
          "a root-relative link, an HTML href, a reference definition and a link across lines are each caught; "
          "code is not read; a tree with no link fails")


def main():
    if "--self-test" in sys.argv:
        self_test()
    files = markdown_files(ROOT)
    problems, checked = check(ROOT)
    report(
        problems,
        f"{len(problems)} problem(s) with the links of {len(files)} Markdown files",
        f"links: all {checked} relative links and anchors in {len(files)} Markdown files resolve",
    )


if __name__ == "__main__":
    main()
