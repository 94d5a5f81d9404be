#!/usr/bin/env python3
"""Fails when a user page states a default, a version or a count that
disagrees with where that fact comes from: the Makefile, the schemas, the
shipped Envoy configs, the committed demo reports and bench results, the pinned hostcall counts
of emulator/tests/abi_cost.rs, the Prometheus rules, the folders themselves.
`make lint` runs it.

Targeted, not clever: FACTS below is a table, one entry per fact a page
states, each with the page, what it reads there, its source and how the
source is read. A fact whose sentence is no longer found fails too (a
reworded page must move its entry, not silently drop the check); so does
internal vocabulary on a user page (VOCABULARY). Each problem names the fact
and the page. `python3 tools/check_doc_facts.py [--root DIR]` checks another
copy of the repository (tools/test_check_doc_facts.py puts each known
disagreement back into a copy and expects a failure naming it). Standard
library only.
"""

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from check_report import report

ROOT = Path(__file__).resolve().parent.parent

# ---- sources ---------------------------------------------------------------


def make_var(root, name):
    """The words of a plain `NAME := words` assignment in the Makefile."""
    found = re.search(rf"^{name} := (.*)$", (root / "Makefile").read_text(), re.M)
    if not found:
        raise LookupError(f"Makefile: no `{name} :=`")
    words = found.group(1).split()
    values = {"$(ENVOY_VERSION)": make_var(root, "ENVOY_VERSION")[0]} if name != "ENVOY_VERSION" else {}
    return [values.get(w, w) for w in words]


def oldest(root):
    return make_var(root, "ENVOY_MINORS")[0]


def make_help(root, target):
    """The `## ...` help text of a Makefile target."""
    found = re.search(rf"^{re.escape(target)}:[^\n]*## (.*)$", (root / "Makefile").read_text(), re.M)
    if not found:
        raise LookupError(f"Makefile: no help line for `{target}`")
    return found.group(1)


def schema_default(root, filt, field):
    schema = json.loads((root / "schema" / f"{filt}.schema.json").read_text())
    return schema["properties"][field]["default"]


def shipped_max_retries(root):
    """Every `max_retries` the shipped Envoy configs (envoy/**.yaml) set."""
    values = set()
    for path in sorted((root / "envoy").rglob("*.yaml")):
        values.update(re.findall(r"max_retries: (\d+)", path.read_text()))
    return values


def demo_cells(root, report_name):
    return json.loads((root / "docs" / report_name).read_text())["matrix"]


# Calls that hand data back to the guest (Envoy allocates the answer in the
# VM): the "of which return data" columns.
DATA_CALLS = {
    "proxy_get_header_map_value",
    "proxy_get_header_map_pairs",
    "proxy_get_property",
    "proxy_get_shared_data",
    "proxy_get_buffer_bytes",
}
# What an ordinary consumer request without `admin_cluster` adds for its
# membership observation (abi_cost.rs's comment: "without an admin cluster
# every answer is a membership observation: the answering address and the
# clock"); with `admin_cluster` an ordinary request makes the rest.
OBSERVATION = ["proxy_get_property", "clock_time_get"]


def rust_literal(text):
    """The nested tuples and slices of a Rust array literal of string
    literals, paths and `&[...]` (what abi_cost.rs pins), as Python lists;
    line comments skipped."""
    tokens = re.findall(r'//[^\n]*|r#"(?:.|\n)*?"#|"(?:\\.|[^"\\])*"|[\[\]()]|[A-Za-z_][\w:]*', text)
    stack = [[]]
    for tok in tokens:
        if tok.startswith("//"):
            continue
        if tok in "[(":
            stack.append([])
        elif tok in "])":
            done = stack.pop()
            stack[-1].append(done)
        elif tok.startswith('r#"'):
            stack[-1].append(tok[3:-2])
        elif tok.startswith('"'):
            stack[-1].append(tok[1:-1])
        else:
            stack[-1].append(tok)
    return stack[0]


def pinned(root, test):
    """The `let pinned ... = [...];` array of the test function `test` in
    emulator/tests/abi_cost.rs, parsed."""
    text = (root / "emulator/tests/abi_cost.rs").read_text()
    body = text[text.index(f"fn {test}(") :]
    start = body.index("= [", body.index("let pinned")) + 2
    end = body.index("\n    ];", start) + 6
    return rust_literal(body[start:end])[0]


def ordinary(root, filt):
    """(VM entries, hostcalls, of which return data) of one ordinary request
    on its default config, as abi_cost.rs pins it."""
    for entry in pinned(root, "an_ordinary_request_costs_each_filter_exactly_its_pinned_count"):
        name, config, callbacks, calls = entry
        if name == f"Filter::{filt}" and config == "":
            return len(callbacks), calls
    raise LookupError(f"abi_cost.rs: no ordinary {filt} request on the default config")


def counts(calls):
    return len(calls), sum(c in DATA_CALLS for c in calls)


def consumer_ordinary(root, admin):
    _, calls = ordinary(root, "Consumer")
    if admin:
        calls = list(calls)
        for c in OBSERVATION:
            calls.remove(c)
    return counts(calls)


def steered(root, what):
    for entry in pinned(root, "a_steered_request_costs_the_consumer_exactly_its_pinned_count"):
        if entry[0] == what:
            return counts(entry[3])
    raise LookupError(f"abi_cost.rs: no steered case {what!r}")


STEERED_PLAIN = "admin membership, plain answer (the bench)"
STEERED_PROVIDER = "admin membership, provider's answer"
STEERED_DEFAULT = "membership from answers (the default config)"


def demo_seconds(root):
    """The committed `make demo` run's wall time, as docs/benchmarks/demo.md
    states it beside its report (checked against the report by the
    demo-run-size fact)."""
    text = (root / "docs/benchmarks/demo.md").read_text()
    found = re.search(r"\(\.\./demo-report\.json\)[^:]*?: \d+ cells in (\d+) s", text)
    if not found:
        raise LookupError("docs/benchmarks/demo.md: the committed run's size is not stated")
    return int(found.group(1))


def s(*values):
    return tuple(str(v) for v in values)


# ---- facts -----------------------------------------------------------------


@dataclass
class Fact:
    """`pattern` (a regex, DOTALL) must match `doc` (its whitespace runs read
    as one space), and its groups must equal
    `source(root)`, a tuple of strings (`what` says where that is); with
    `names`, each group is read as a list (its backticked names, or its
    comma- and and-separated words), sorted and comma-joined."""

    name: str
    doc: str
    pattern: str
    source: Callable
    what: str
    names: bool = False


def listed(text):
    names = re.findall(r"`([\w.-]+)`", text)
    if not names:
        names = [w.strip() for w in re.split(r",\s*|\s+and\s+", text) if w.strip()]
    return ",".join(sorted(names))


FACTS = [
    Fact(
        "oldest-suites",
        "docs/configuration/envoy-versions.md",
        r"the Makefile's `OLDEST_SUITES`\): (.*?)\.\s",
        lambda r: (",".join(sorted(make_var(r, "OLDEST_SUITES"))),),
        "the suites make e2e-oldest runs: the Makefile's OLDEST_SUITES",
        names=True,
    ),
    Fact(
        "oldest-suites",
        "docs/development/make-targets.md",
        r"`OLDEST_SUITES` lists \((.*?)\)",
        lambda r: (",".join(sorted(make_var(r, "OLDEST_SUITES"))),),
        "the Makefile's OLDEST_SUITES",
        names=True,
    ),
    Fact(
        "envoy-versions",
        "docs/configuration/envoy-versions.md",
        r"runs\s+every suite on Envoy ([\d.]+) and, on ([\d.]+) \(the oldest",
        lambda r: (make_var(r, "ENVOY_VERSION")[0], oldest(r)),
        "the Makefile's ENVOY_VERSION and the first of ENVOY_MINORS",
    ),
    Fact(
        "envoy-oldest",
        "docs/development/make-targets.md",
        r"on Envoy ([\d.]+), the oldest a shipped mesh runs",
        lambda r: (oldest(r),),
        "the first of the Makefile's ENVOY_MINORS",
    ),
    Fact(
        "native-refused-on",
        "docs/configuration/envoy-versions.md",
        r"`harness/tests/native\.rs` checks it on ([\d.]+) in `make test`",
        lambda r: (make_var(r, "ENVOY_TOO_OLD_FOR_NATIVE")[0],),
        "the Makefile's ENVOY_TOO_OLD_FOR_NATIVE",
    ),
    Fact(
        "native-minors",
        "docs/configuration/envoy-versions.md",
        r"\*\*The native module\*\* runs on ([\d., and]+?) only",
        lambda r: (",".join(sorted(make_var(r, "NATIVE_MINORS"))),),
        "the Makefile's NATIVE_MINORS",
        names=True,
    ),
    Fact(
        "native-minors",
        "docs/deploy/front-proxy.md",
        r"the native module runs on ([\d., and]+?) only",
        lambda r: (",".join(sorted(make_var(r, "NATIVE_MINORS"))),),
        "the Makefile's NATIVE_MINORS",
        names=True,
    ),
    Fact(
        "native-minors",
        "docs/development/make-targets.md",
        r"the native module where it runs \(([\d., and]+?)\)",
        lambda r: (",".join(sorted(make_var(r, "NATIVE_MINORS"))),),
        "the Makefile's NATIVE_MINORS",
        names=True,
    ),
    Fact(
        "native-minors",
        "docs/development/make-targets.md",
        r"one Envoy dynamic module \(ABI v[\d.]+, Envoy ([\d., and]+?)\)",
        lambda r: (",".join(sorted(make_var(r, "NATIVE_MINORS"))),),
        "the Makefile's NATIVE_MINORS",
        names=True,
    ),
    Fact(
        "native-minors",
        "docs/deploy/native.md",
        r"It loads only on an Envoy of that ABI, ([\d., and]+?),",
        lambda r: (",".join(sorted(make_var(r, "NATIVE_MINORS"))),),
        "the Makefile's NATIVE_MINORS",
        names=True,
    ),
    Fact(
        "test-tools-packages",
        "docs/development/make-targets.md",
        r"`make test-tools` \| installs what the tests use beyond Rust and Python: (.*?) \(Debian\)",
        lambda r: (",".join(sorted(make_var(r, "APT_TOOLS"))),),
        "the Makefile's APT_TOOLS",
        names=True,
    ),
    Fact(
        "tombstones-alert",
        "docs/operations/alerting.md",
        r"near `max_tombstones` \((\d+) of the default (\d+)\)",
        lambda r: s(
            re.search(r"graceful_consumer_tombstones > (\d+)", (r / "examples/prometheus/rules.yaml").read_text()).group(1),
            schema_default(r, "graceful_consumer", "max_tombstones"),
        ),
        "the alert's threshold in examples/prometheus/rules.yaml; max_tombstones's default in the schema",
    ),
    Fact(
        "drain-defaults",
        "docs/benchmarks/targets.md",
        r"with the defaults \((\d+) s \+ (\d+) ms",
        lambda r: s(
            schema_default(r, "graceful_drain", "consumer_update_wait").removesuffix("s"),
            schema_default(r, "graceful_drain", "quiet_window").removesuffix("ms"),
        ),
        "consumer_update_wait's and quiet_window's defaults in schema/graceful_drain.schema.json",
    ),
    Fact(
        "hostcalls-ordinary",
        "docs/benchmarks/where-it-goes.md",
        r"\| graceful_drain \| \d+ → \*\*(\d+)\*\*.*?\| \d+ → (\d+) \| \d+ → (\d+) \|",
        lambda r: s(ordinary(r, "Drain")[0], *counts(ordinary(r, "Drain")[1])),
        "graceful_drain's ordinary request pinned in emulator/tests/abi_cost.rs",
    ),
    Fact(
        "hostcalls-ordinary",
        "docs/benchmarks/where-it-goes.md",
        r"\| graceful_provider \| \d+ → \*\*(\d+)\*\* \| \d+ → \*\*(\d+)\*\*.*?\| \d+ → \*\*(\d+)\*\* \|",
        lambda r: s(ordinary(r, "Provider")[0], *counts(ordinary(r, "Provider")[1])),
        "graceful_provider's ordinary request pinned in emulator/tests/abi_cost.rs",
    ),
    Fact(
        "hostcalls-ordinary",
        "docs/benchmarks/where-it-goes.md",
        r"\| graceful_consumer \| \d+ → \*\*(\d+)\*\* \| \d+ → \*\*(\d+)\*\* with `admin_cluster` \(\*\*(\d+)\*\* without\)"
        r" \| \d+ → \*\*(\d+)\*\* \(\*\*(\d+)\*\* without\)",
        lambda r: s(
            ordinary(r, "Consumer")[0],
            consumer_ordinary(r, True)[0],
            consumer_ordinary(r, False)[0],
            consumer_ordinary(r, True)[1],
            consumer_ordinary(r, False)[1],
        ),
        "graceful_consumer's ordinary request pinned in emulator/tests/abi_cost.rs (with admin_cluster: less the membership observation)",
    ),
    Fact(
        "hostcalls-ordinary",
        "docs/benchmarks/where-it-goes.md",
        r"over an ordinary one \((\d+) / (\d+) with `admin_cluster`, (\d+) / (\d+) without",
        lambda r: s(*consumer_ordinary(r, True), *consumer_ordinary(r, False)),
        "graceful_consumer's ordinary request pinned in emulator/tests/abi_cost.rs",
    ),
    Fact(
        "hostcalls-steered",
        "docs/benchmarks/where-it-goes.md",
        r"\| now, `admin_cluster` and an answer without an instance id[^|]*\| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|"
        r".*?\| now, `admin_cluster` and a graceful_provider's answer[^|]*\| (\d+) \| (\d+) \|"
        r".*?\| now, no `admin_cluster` \| (\d+) \| (\d+) \|",
        lambda r: s(*steered(r, STEERED_PLAIN), *steered(r, STEERED_PROVIDER), *steered(r, STEERED_DEFAULT)),
        "the steered requests pinned in emulator/tests/abi_cost.rs",
    ),
    Fact(
        "hostcalls-steered",
        "docs/benchmarks/mesh.md",
        r"is (\d+) hostcalls, (\d+) returning data, against the ordinary request's (\d+) and (\d+)",
        lambda r: s(*steered(r, STEERED_PLAIN), *consumer_ordinary(r, True)),
        "the steered and ordinary requests (admin_cluster) pinned in emulator/tests/abi_cost.rs",
    ),
    Fact(
        "hostcalls-steered",
        "docs/benchmarks/targets.md",
        r"\+(\d+) hostcalls, the same with 1 or 100 tombstones",
        lambda r: s(steered(r, STEERED_PLAIN)[0] - consumer_ordinary(r, True)[0]),
        "the steered and ordinary requests (admin_cluster) pinned in emulator/tests/abi_cost.rs",
    ),
    Fact(
        "hostcalls-ordinary",
        "docs/benchmarks/count.md",
        r"an ordinary provider request makes (\d+) VM entries and (\d+) hostcalls, none returning data;"
        r"\s+an ordinary consumer\s+request \(with `admin_cluster`\) (\d+) entries and (\d+) hostcalls",
        lambda r: s(
            ordinary(r, "Provider")[0],
            len(ordinary(r, "Provider")[1]),
            ordinary(r, "Consumer")[0],
            consumer_ordinary(r, True)[0],
        ),
        "the ordinary requests pinned in emulator/tests/abi_cost.rs",
    ),
    Fact(
        "demo-time",
        "README.md",
        r"`make demo` about (\d+) minutes",
        lambda r: s(round(demo_seconds(r) / 60)),
        "the committed make demo run's time, as docs/benchmarks/demo.md states it",
    ),
    Fact(
        "demo-time",
        "Makefile",
        r"\.PHONY: demo demo: .*?## .*?\(about (\d+) min",
        lambda r: s(round(demo_seconds(r) / 60)),
        "the committed make demo run's time, as docs/benchmarks/demo.md states it",
    ),
]

# ---- checks that are not one sentence --------------------------------------

# Words for the repository's history, not for a reader: a field's change of
# status and issue numbers (also refused by tools/gen_config_reference.py in
# the configuration types' doc comments).
VOCABULARY = re.compile(r"\((?:added|new|changed)\)|added to the contract|\bissues? #?\d+|\bthe issue's\b", re.I)
# docs/releasing.md is about the repository's own process.
VOCABULARY_SKIP = {"docs/releasing.md"}


def user_pages(root):
    pages = sorted(p for p in (root / "docs").rglob("*.md"))
    return [p for p in pages if str(p.relative_to(root)) not in VOCABULARY_SKIP] + [root / "examples/README.md"]


def check_vocabulary(root):
    problems = []
    for page in user_pages(root):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for found in VOCABULARY.finditer(line):
                problems.append(
                    f"{page.relative_to(root)}:{n}: internal-vocabulary: {found.group(0)!r} is the repository's "
                    "history, not something a reader can use: say what it is, or leave it out"
                )
    return problems


MAX_RETRIES = re.compile(r"`max_retries`.{0,120}?default,?\s+(?:of\s+)?\(?(\d+)", re.S)


def check_max_retries(root):
    """A page that says which `max_retries` the shipped sidecars set must say
    what envoy/**.yaml sets."""
    shipped = shipped_max_retries(root)
    problems = []
    for page in user_pages(root):
        text = page.read_text()
        for found in MAX_RETRIES.finditer(text):
            if found.group(1) not in shipped:
                line = text.count("\n", 0, found.start(1)) + 1
                problems.append(
                    f"{page.relative_to(root)}:{line}: max-retries: says {found.group(1)}; the shipped Envoy "
                    f"configs (envoy/**.yaml) set `max_retries` to {', '.join(sorted(shipped))}"
                )
    return problems


DEFAULT_STATED = re.compile(r"`(\w+)` \(default,? ([^)]{1,20})\)|`(\w+)`,? \(?(on|off|[\d.]+ ?m?s) by default")


def schema_defaults(root):
    """Each filter field's default, by name; None where two filters give
    one name different defaults (no page can state one then)."""
    defaults = {}
    for path in sorted((root / "schema").glob("*.schema.json")):
        for name, prop in json.loads(path.read_text())["properties"].items():
            value = prop.get("default", False if prop.get("type") == "object" else None)
            defaults[name] = value if defaults.get(name, value) == value else None
    return defaults


def as_stated(value):
    """A schema default as a page says it: `true` on, absent off, `3s` 3 s."""
    if value is True:
        return "on"
    if value in (False, None):
        return "off"
    return str(value)


def check_defaults(root):
    """A page that says a field's default (`field` (default X), `field`, X
    by default) says the schema's."""
    defaults = schema_defaults(root)
    problems = []
    for page in user_pages(root):
        if page.name == "configuration.md":
            continue
        text = re.sub(r"\s+", " ", page.read_text())
        for found in DEFAULT_STATED.finditer(text):
            name, value = found.group(1) or found.group(3), found.group(2) or found.group(4)
            if name not in defaults or defaults[name] is None and value != "off":
                continue
            if value.replace(" ", "") != as_stated(defaults[name]):
                problems.append(
                    f"{page.relative_to(root)}: field-default: says `{name}` defaults to {value}; "
                    f"the schema's default is {as_stated(defaults[name])}"
                )
    return problems


def check_tests_listed(root):
    """Every real-Envoy suite (harness/tests/*.rs) is named in
    docs/development/tests.md; a row that says a suite runs on both
    deliveries or on the oldest Envoy names only suites the Makefile's
    NATIVE_SUITES or OLDEST_SUITES hold."""
    page = "docs/development/tests.md"
    text = (root / page).read_text()
    named = set(re.findall(r"`(?:harness/tests/)?(\w+)\.rs`", text))
    for group in re.findall(r"harness/tests/\{([\w,]+)\}\.rs", text):
        named.update(group.split(","))
    suites = sorted(p.stem for p in (root / "harness/tests").glob("*.rs"))
    problems = [
        f"{page}: tests-listed: harness/tests/{s}.rs is not named (a suite each layer's row lists)"
        for s in suites
        if s not in named
    ]
    native, old = set(make_var(root, "NATIVE_SUITES")), set(make_var(root, "OLDEST_SUITES"))
    for row in (l for l in text.splitlines() if l.startswith("| ")):
        where = row.split("|")[2]
        row_suites = set(re.findall(r"harness/tests/(\w+)\.rs", where))
        for group in re.findall(r"harness/tests/\{([\w,]+)\}\.rs", where):
            row_suites.update(group.split(","))
        if "both deliveries" in where:
            problems += [
                f"{page}: native-suites: says {s} runs on both deliveries; the Makefile's NATIVE_SUITES has no {s}"
                for s in sorted(row_suites - native)
            ]
        if "also on 1.36.4" in where:
            problems += [
                f"{page}: oldest-suites: says {s} runs on 1.36.4; the Makefile's OLDEST_SUITES has no {s}"
                for s in sorted(row_suites - old)
            ]
    return problems


def check_examples_index(root):
    """examples/README.md has a row for every folder of examples/, and that
    row names every YAML file at the folder's top."""
    page = "examples/README.md"
    rows = {}
    for line in (root / page).read_text().splitlines():
        found = re.match(r"\| \[`([\w-]+)`\]\(", line)
        if found:
            rows[found.group(1)] = line
    problems = []
    for folder in sorted(p for p in (root / "examples").iterdir() if p.is_dir()):
        row = rows.get(folder.name)
        if row is None:
            problems.append(f"{page}: examples-index: examples/{folder.name}/ has no row")
            continue
        problems += [
            f"{page}: examples-index: the row of {folder.name} does not name {f.name}"
            for f in sorted(folder.glob("*.yaml"))
            if f.name not in row
        ]
    return problems


def check_alerting(root):
    """The alert table of docs/operations/alerting.md is one table with a row
    for every alert of examples/prometheus/rules.yaml, at its severity; the
    recording rules it lists are the file's."""
    page = "docs/operations/alerting.md"
    text = (root / page).read_text()
    rules = (root / "examples/prometheus/rules.yaml").read_text()
    alerts = re.findall(r"- alert: (\w+)\n(?:\s+(?!- ).*\n)*?\s+severity: (\w+)", rules)
    head = text.index("| alert (severity) |")
    table = re.match(r"(?:\|[^\n]*\n)+", text[head:]).group(0)
    problems = []
    for name, severity in alerts:
        if not re.search(rf"`{name}` \({severity}[,)]", table):
            problems.append(f"{page}: alerts: no row for `{name}` ({severity}) in the alert table (rules.yaml has it)")
    for name in re.findall(r"`(Graceful\w+)`", text):
        if name not in dict(alerts):
            problems.append(f"{page}: alerts: names `{name}`, which examples/prometheus/rules.yaml does not have")
    records = set(re.findall(r"- record: (\S+)", rules))
    stated = set(re.findall(r"`(namespace_app:[\w:]+)`", text))
    if stated != records:
        problems.append(
            f"{page}: recording-rules: lists {', '.join(sorted(stated))}; rules.yaml records {', '.join(sorted(records))}"
        )
    return problems


def drain_s(cell):
    return f"{sum(cell['gone_ms']) / len(cell['gone_ms']) / 1000:.1f} s"


def main_row(cell):
    return [
        cell["scenario"],
        cell["approach"],
        cell["protocol"],
        str(cell["requests"]),
        str(cell["failed"]),
        str(cell["after_closing"]),
        drain_s(cell),
        str(cell["retries"]),
        f"{cell['p50_ms']:.1f}",
        f"{cell['p99_ms']:.1f}",
        f"{cell['max_ms']:.1f}",
    ]


def check_demo(root):
    """docs/benchmarks/demo.md: each committed run's stated size (N cells in
    T s) against its report (N cells; T no less than the cells' durations
    and not far above); the main table is the report's, row by row, every
    cell of its scenarios; every approach the legend places in a scenario
    ran there."""
    page = "docs/benchmarks/demo.md"
    text = (root / page).read_text()
    problems = []
    for name, n, secs in re.findall(r"\(\.\./(demo-report[\w-]*\.json)\)[^:]*?: (\d+) cells in (\d+) s", text):
        cells = demo_cells(root, name)
        ran = sum(c["duration_ms"] for c in cells) / 1000
        if int(n) != len(cells):
            problems.append(f"{page}: demo-run-size: says {n} cells for {name}, which has {len(cells)}")
        if not ran <= int(secs) <= ran * 1.1 + 30:
            problems.append(f"{page}: demo-run-size: says {name} took {secs} s; its cells ran {ran:.0f} s")
    cells = [c for c in demo_cells(root, "demo-report.json") if c["scenario"] not in ("keepalive_clients", "scale_down")]
    start = text.index("| scenario | approach | protocol | requests |")
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in re.match(r"(?:\|[^\n]*\n)+", text[start:]).group(0).splitlines()[2:]
    ]
    want = [main_row(c) for c in cells]
    for row in rows:
        if row not in want:
            problems.append(f"{page}: demo-table: the row {' | '.join(row)} is not a cell of docs/demo-report.json")
    for row in want:
        if row not in rows:
            problems.append(f"{page}: demo-table: no row for the cell {' | '.join(row)} of docs/demo-report.json")
    found = re.search(r"the (\d+) cells below", text)
    if not found or int(found.group(1)) != len(want):
        problems.append(f"{page}: demo-table: says {found and found.group(1)} cells below; the table has {len(want)}")
    ran = {(c["approach"], c["scenario"]) for f in ("demo-report.json", "demo-report-scale-down.json") for c in demo_cells(root, f)}
    for approach, where in re.findall(r"\| `(\w+)` \|[^\n]*?, in ((?:`\w+`(?:,| and)? ?)+)(?:only)? ?\|", text):
        for scenario in re.findall(r"`(\w+)`", where):
            if (approach, scenario) not in ran:
                problems.append(f"{page}: demo-legend: says {approach} runs in {scenario}; no committed cell has it")
    return problems


def table_after(text, header):
    """The body rows of the Markdown table whose header line starts with
    `header`, as lists of stripped cells."""
    start = text.index(header)
    lines = re.match(r"(?:\|[^\n]*\n)+", text[start:]).group(0).splitlines()[2:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def number(cell):
    return int(re.sub(r"[*,+]", "", cell))


def check_counts(root):
    """docs/benchmarks/count.md: the table against the floors is
    bench/results/count.json's (each set's instructions per request, its
    difference to `none` and to its floor), and the call prices are
    bench/results/prices.json's."""
    page = "docs/benchmarks/count.md"
    text = (root / page).read_text()
    sets = {s["set"]: s["worker_per_request"] for s in json.loads((root / "bench/results/count.json").read_text())["sets"]}
    problems = []
    for row in table_after(text, "| set | worker instructions per request | over `none` | over its floor |"):
        name = re.search(r"`(\w+)`", row[0]).group(1)
        if name not in sets:
            problems.append(f"{page}: bench-count: the set {name} is not in bench/results/count.json")
            continue
        floor = sets["native_floor"] if name.endswith("_native") else sets["wasm_header"]
        want = [sets[name], sets[name] - sets["none"], sets[name] - floor]
        for cell, value, what in zip(row[1:4], want, ["per request", "over none", "over its floor"]):
            if cell and number(cell) != value:
                problems.append(f"{page}: bench-count: {name} {what} says {cell}; bench/results/count.json gives {value:,}")
    prices = json.loads((root / "bench/results/prices.json").read_text())
    found = re.search(r"Against the floor's ([\d,]+) per request", text)
    if not found or number(found.group(1)) != prices["floor_per_request"]:
        problems.append(f"{page}: bench-prices: the floor's count is not bench/results/prices.json's {prices['floor_per_request']:,}")
    per_call = {p["call"]: p["per_call"] for p in prices["prices"]}
    rows = table_after(text, "| call | instructions per call | what it is |")
    for row in rows:
        name = row[0].strip("`")
        if per_call.get(name) != number(row[1]):
            problems.append(f"{page}: bench-prices: {name} says {row[1]}; bench/results/prices.json gives {per_call.get(name)}")
    if len(rows) != len(per_call):
        problems.append(f"{page}: bench-prices: {len(rows)} calls in the table; bench/results/prices.json prices {len(per_call)}")
    return problems


CHECKS = [
    check_vocabulary,
    check_max_retries,
    check_defaults,
    check_tests_listed,
    check_examples_index,
    check_alerting,
    check_demo,
    check_counts,
]


def check_fact(root, fact):
    # Line breaks and indentation are not part of a sentence.
    text = re.sub(r"\s+", " ", (root / fact.doc).read_text())
    found = re.search(fact.pattern, text, re.S)
    if not found:
        return [f"{fact.doc}: {fact.name}: the sentence stating it is gone (pattern {fact.pattern!r}); move the entry"]
    stated = tuple(listed(g) if fact.names else g for g in found.groups())
    want = tuple(fact.source(root))
    if stated != want:
        return [f"{fact.doc}: {fact.name}: says {', '.join(stated)}; {fact.what}: {', '.join(want)}"]
    return []


def problems_in(root):
    problems = []
    for fact in FACTS:
        try:
            problems += check_fact(root, fact)
        except (LookupError, ValueError, OSError, KeyError) as e:
            problems.append(f"{fact.doc}: {fact.name}: its source cannot be read: {e}")
    for check in CHECKS:
        problems += check(root)
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository to check (default: this one)")
    args = ap.parse_args()
    report(
        problems_in(args.root.resolve()),
        "the docs disagree with their sources (above): fix the page, or the entry in tools/check_doc_facts.py",
        f"the docs agree with their sources: {len(FACTS)} stated facts, {len(CHECKS)} whole-page checks",
    )


if __name__ == "__main__":
    main()
