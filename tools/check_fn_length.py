#!/usr/bin/env python3
"""Fails when a Rust function in harness/src or filters/ is longer than
MAX_LINES lines (from its `fn` line to its closing brace): a function that
long does several things, and is hard to change safely; split it into named
steps. Prints file:line, the name and the length of each, longest first, and
exits 1. `--self-test` runs it on small sources with known lengths first.
`python3 tools/check_fn_length.py [PATH...]` checks other trees or files.
Standard library only, so anyone can rerun it.
"""

import os
import re
import sys
import tempfile

from check_report import report

MAX_LINES = 120
ROOTS = ("harness/src", "filters")
# Build outputs and fuzz corpora are not source.
SKIP_DIRS = {"target", ".git", "corpus"}

FN = re.compile(
    r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?"
    r"(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)"
)


def blank(text):
    """`text` with comments, strings and char literals replaced by spaces
    (newlines kept), so braces and `fn` count only where they are code."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif m := re.match(r'b?r(#*)"', text[i:i + 260]) if c in "br" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None:
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            wipe(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{7f}'), else a lifetime ('a).
            if text.startswith("\\", i + 1):
                j = text.find("'", i + 2)
                j = n if j < 0 else j + 1
                wipe(i, j)
                i = j
            elif i + 2 < n and text[i + 2] == "'":
                wipe(i, i + 3)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def functions(text):
    """(line, name, length) of every function with a body in `text`."""
    code = blank(text)
    lines = code.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    found = []
    for number, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        # The body opens at the first `{` after the signature; a `;` first
        # means a declaration without one (a trait's method).
        pos = starts[number] + m.end()
        depth_paren = 0
        while pos < len(code):
            ch = code[pos]
            if ch in "(<[":
                depth_paren += 1
            elif ch in ")>]":
                depth_paren -= 1
            elif ch == ";" and depth_paren <= 0:
                pos = -1
                break
            elif ch == "{" and depth_paren <= 0:
                break
            pos += 1
        if pos < 0 or pos >= len(code):
            continue
        depth, end = 0, pos
        while end < len(code):
            if code[end] == "{":
                depth += 1
            elif code[end] == "}":
                depth -= 1
                if depth == 0:
                    break
            end += 1
        last = code.count("\n", 0, end)
        found.append((number + 1, m.group(1), last - number + 1))
    return found


def rust_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for name in sorted(names):
                if name.endswith(".rs"):
                    yield os.path.join(root, name)


def check(paths, limit=MAX_LINES):
    """Every function over `limit` lines: (path, line, name, length), longest first."""
    long = []
    for path in rust_files(paths):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for line, name, length in functions(text):
            if length > limit:
                long.append((path, line, name, length))
    return sorted(long, key=lambda f: (-f[3], f[0], f[1]))


def self_test():
    """Known lengths must be measured, and only the long one reported."""
    body = lambda n: "".join(f"    let x{i} = {i};\n" for i in range(n - 2))
    source = (
        "// fn commented(x: u32) {\n"
        "pub(crate) async fn short<'a>(s: &'a str) -> Vec<u8>\nwhere\n    u8: Copy,\n{\n"
        '    let _ = ("}}}", \'{\', r#"{ " }"#, b\'}\');\n'
        "}\n"
        "trait T {\n    fn declared(&self) -> [u8; 2];\n}\n"
        f"fn at_limit() {{\n{body(MAX_LINES)}}}\n"
        f"fn over() {{\n{body(MAX_LINES + 1)}    /* {{ nested /* }} */ */\n}}\n"
        "mod tests {\n    #[test]\n    fn inner() {\n        let c = '\\'';\n    }\n}\n"
    )
    measured = {name: length for _, name, length in functions(source)}
    assert measured == {
        "short": 6,
        "at_limit": MAX_LINES,
        "over": MAX_LINES + 2,
        "inner": 3,
    }, measured
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "a.rs"), "w", encoding="utf-8") as f:
        f.write(source)
    found = check([d])
    assert [(name, length) for _, _, name, length in found] == [("over", MAX_LINES + 2)], found
    print(
        "check_fn_length self-test: lengths measured through signatures, strings, "
        f"chars, lifetimes and comments; only the one over {MAX_LINES} lines is reported"
    )


def main():
    args = [a for a in sys.argv[1:] if a != "--self-test"]
    if "--self-test" in sys.argv:
        self_test()
    repo = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    paths = args or [os.path.join(repo, r) for r in ROOTS]
    long = check(paths)
    report(
        [
            f"{os.path.relpath(path, repo)}:{line}: fn {name} is {length} lines (at most {MAX_LINES})"
            for path, line, name, length in long
        ],
        f"{len(long)} function(s) over {MAX_LINES} lines: split each into named steps",
        f"{', '.join(ROOTS) if not args else ', '.join(args)}: no function over {MAX_LINES} lines",
    )


if __name__ == "__main__":
    main()
