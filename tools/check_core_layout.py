#!/usr/bin/env python3
"""Checks the rooms of filters/core/src (docs/architecture.md): no module
imports a sibling filter room's internals, `shared/` imports no filter room,
and the module import graph has no cycle. Reads `crate::`/`super::` paths
(in `use` statements and inline); prints file:line for each violation and
exits 1. `--self-test` runs it on small trees with known faults first.
Standard library only, so anyone can rerun it: `python3 tools/check_core_layout.py`.
"""

import os
import re
import sys
import tempfile

FILTER_ROOMS = ("provider", "drain", "consumer")
SHARED = "shared"

COMMENT = re.compile(r"//.*$")
STRING = re.compile(r'"(?:\\.|[^"\\])*"')
USE = re.compile(r"\buse\s+((?:crate|super)\b[^;]*);", re.S)
INLINE = re.compile(r"\b((?:crate|super)(?:::(?:super|\w+))+)")
INLINE_MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{")
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;')


def module_of_file(src, rel):
    """Module path of a file by its place in the tree."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def load(src):
    """Every .rs file: its module path and its lines with comments and strings blanked."""
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                files[os.path.relpath(path, src).replace(os.sep, "/")] = open(path, encoding="utf-8").read()
    modules = {rel: module_of_file(src, rel) for rel in files}
    # `#[path = "x.rs"] mod tests;` puts x.rs under the declaring module.
    for rel, text in files.items():
        for target, name in PATH_ATTR.findall(text):
            target_rel = os.path.normpath(os.path.join(os.path.dirname(rel), target)).replace(os.sep, "/")
            if target_rel in modules:
                modules[target_rel] = modules[rel] + (name,)
    return files, modules


def expand(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (`self` keeps the prefix)."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix = tree[:start].rstrip(":")
                inner, parts, d, last = tree[start + 1:i], [], 0, 0
                for j, c in enumerate(inner):
                    d += c == "{"
                    d -= c == "}"
                    if c == "," and d == 0:
                        parts.append(inner[last:j])
                        last = j + 1
                parts.append(inner[last:])
                out = []
                for p in filter(None, parts):
                    out += [prefix if q == "self" else prefix + "::" + q for q in expand(p)]
                return out
    return [tree]


def references(text, module):
    """(line, segments) for each crate/super path, relative to the inline module it sits in."""
    lines = [COMMENT.sub("", STRING.sub('""', l)) for l in text.split("\n")]
    # The module each line is in: the file's, plus inline `mod x {` blocks.
    scope, stack, depth = [], [], 0
    for line in lines:
        m = INLINE_MOD.match(line)
        if m:
            stack.append((m.group(1), depth))
        scope.append(module + tuple(n for n, _ in stack))
        depth += line.count("{") - line.count("}")
        while stack and depth <= stack[-1][1]:
            stack.pop()
    clean = "\n".join(lines)
    found, used = [], set()
    for m in USE.finditer(clean):
        line = clean.count("\n", 0, m.start())
        for path in expand(re.sub(r"\s+as\s+\w+", "", m.group(1))):
            found.append((line, path))
        used.update(range(m.start(), m.end()))
    for m in INLINE.finditer(clean):
        if m.start() not in used:
            found.append((clean.count("\n", 0, m.start()), m.group(1)))
    out = []
    for line, path in found:
        segs = [s for s in path.split("::") if s]
        here = list(scope[line])
        if segs[0] == "crate":
            base, segs = [], segs[1:]
        else:
            base = here
            while segs and segs[0] == "super":
                base, segs = base[:-1], segs[1:]
        out.append((line + 1, tuple(base) + tuple(s for s in segs if s != "*")))
    return out


def resolve(known, path):
    """The deepest module (file or inline) a path names."""
    best = ()
    for i in range(1, len(path) + 1):
        if path[:i] in known:
            best = path[:i]
        else:
            break
    return best


def room(module):
    return module[0] if module and module[0] in FILTER_ROOMS + (SHARED,) else "root"


def check(src):
    files, modules = load(src)
    known = set(modules.values())
    file_of = {m: rel for rel, m in modules.items()}
    problems, edges = [], {}
    for rel, text in sorted(files.items()):
        here = modules[rel]
        for line, path in references(text, here):
            target = resolve(known, path)
            if not target or target == here:
                continue
            where = f"filters/core/src/{rel}:{line}"
            shown = "crate::" + "::".join(path)
            a, b = room(here), room(target)
            if a == SHARED and b != SHARED:
                problems.append(f"{where}: shared/ imports {shown} (shared imports only shared)")
            if a in FILTER_ROOMS and b in FILTER_ROOMS and a != b and target != (b,):
                problems.append(f"{where}: room {a} imports {shown}, an internal of room {b} (use its facade, crate::{b}::Item)")
            # A module holding its own children is not an import of them.
            if target[: len(here)] != here:
                edges.setdefault(rel, {}).setdefault(file_of[target], (where, shown))
    problems += cycles(edges)
    return problems


def cycles(edges):
    """Tarjan's strongly connected components; one line per circle."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    nodes = sorted(set(edges) | {t for e in edges.values() for t in e})

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                members = set(comp)
                hops = [f"{edges[a][b][0]} ({edges[a][b][1]})" for a in sorted(members) for b in sorted(edges.get(a, {})) if b in members]
                out.append("import cycle among " + ", ".join(sorted(comp)) + ": " + "; ".join(hops))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def self_test():
    """Known-bad trees must be caught, and a good one must pass."""
    def tree(files):
        d = tempfile.mkdtemp()
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            open(os.path.join(d, rel), "w").write(text)
        return d

    base = {
        "lib.rs": "pub mod drain;\npub mod provider;\npub mod shared;\n",
        "shared/mod.rs": "pub mod gate;\npub mod metrics;\n",
        "shared/gate.rs": "use crate::shared::metrics::Metric;\n",
        "shared/metrics.rs": "pub struct Metric;\n",
        "drain/mod.rs": "pub mod record;\npub use record::Phase;\n",
        "drain/record.rs": "use super::super::shared::gate;\npub struct Phase;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        "provider/mod.rs": "pub mod filter;\n",
        "provider/filter.rs": "use crate::drain::Phase; // facade: allowed\n",
    }
    good = check(tree(base))
    assert good == [], good
    cyc = check(tree(dict(base, **{"shared/metrics.rs": "use crate::shared::{gate::Stat, store};\npub struct Metric;\n"})))
    assert any("import cycle" in p and "shared/gate.rs" in p and "shared/metrics.rs" in p for p in cyc), cyc
    inner = check(tree(dict(base, **{"provider/filter.rs": "fn f() { crate::drain::record::Phase; }\n"})))
    assert any("provider/filter.rs:1: room provider imports crate::drain::record::Phase" in p for p in inner), inner
    up = check(tree(dict(base, **{"shared/gate.rs": "use crate::{drain::Phase, shared::metrics::Metric};\n"})))
    assert any("shared/gate.rs:1: shared/ imports crate::drain::Phase" in p for p in up), up
    print("check_core_layout self-test: a good tree passes; a cycle, a sibling's internal and shared importing a room are each caught")


def main():
    if "--self-test" in sys.argv:
        self_test()
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "filters", "core", "src")
    problems = check(os.path.normpath(src))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layout problem(s); see docs/architecture.md")
        sys.exit(1)
    print("filters/core/src layout: no cross-room internal import, no import cycle")


if __name__ == "__main__":
    main()
