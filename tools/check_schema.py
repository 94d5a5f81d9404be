#!/usr/bin/env python3
"""Holds each filter's JSON Schema (schema/<filter>.schema.json) against the
configs the repository ships and against the filters' own parser.

- Every plugin configuration found in envoy/ and examples/ validates against
  its filter's schema and is accepted by the parser. They are found by
  walking the YAML: a wasm filter's `root_id`, a dynamic module's
  `filter_name`, an Istio WasmPlugin's `pluginName`, an Envoy Gateway
  EnvoyExtensionPolicy's `rootID`, or a `<filter>-config.json` file. Templates
  (`${NAME:-default}`) are read as `make render` wrote them, in target/envoy/.
  Each place in EXPECTED must yield at least one config of its kind.
- The corpus (schema/tests/corpus.json): every good config passes both; every
  bad one is refused by the parser, naming the field the entry names, and by
  the schema, unless the entry names a parser-only rule, in which case the
  schema must accept it. The rules so named are exactly the schema's
  `x-parser-only-rules`: a gap is listed, never silent.

The parser is graceful-core's `config_schema parse` (--parser: the command
that runs that example). Run by `make schema-check` (part of `make unit`).
"""

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
FILTERS = ("graceful_provider", "graceful_drain", "graceful_consumer")
WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
NATIVE_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
)

# (directory, kind, filter): each must yield at least one config, so a
# config moved or renamed out of the walk's sight fails here.
EXPECTED = [
    ("envoy", "envoy wasm filter", "graceful_provider"),
    ("envoy", "envoy wasm filter", "graceful_drain"),
    ("envoy", "envoy wasm filter", "graceful_consumer"),
    ("envoy/native", "envoy dynamic module", "graceful_provider"),
    ("envoy/native", "envoy dynamic module", "graceful_drain"),
    ("envoy/native", "envoy dynamic module", "graceful_consumer"),
    ("envoy/compose", "envoy wasm filter", "graceful_provider"),
    ("envoy/compose", "envoy wasm filter", "graceful_drain"),
    ("envoy/compose", "envoy wasm filter", "graceful_consumer"),
    ("examples/istio", "Istio WasmPlugin", "graceful_provider"),
    ("examples/istio", "Istio WasmPlugin", "graceful_drain"),
    ("examples/istio", "Istio WasmPlugin", "graceful_consumer"),
    ("examples/istio", "envoy wasm filter", "graceful_consumer"),
    ("examples/envoy-gateway", "Envoy Gateway EnvoyExtensionPolicy", "graceful_consumer"),
    ("examples/kubernetes", "config file", "graceful_drain"),
]


class Config:
    """One plugin configuration as shipped: its JSON text, or its value."""

    def __init__(self, where, kind, filter_name, text=None, value=None):
        self.where, self.kind, self.filter = where, kind, filter_name
        self.text = text if text is not None else json.dumps(value)

    def value(self):
        # Empty configuration means all defaults, as the parser reads it.
        return json.loads(self.text) if self.text.strip() else {}


def source_of(path):
    """The text to read for a shipped file: a template's rendering where
    `make render` wrote one (a config still holding a `${` fails below)."""
    rendered = ROOT / "target" / "envoy" / path.name
    if path.parent == ROOT / "envoy" and rendered.exists():
        return rendered.read_text()
    return path.read_text()


def configs_in(node, where, found):
    """Every plugin configuration in a parsed YAML document."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            configs_in(item, f"{where}[{i}]", found)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("kind")
    spec = node.get("spec") or {}
    if kind == "WasmPlugin" and spec.get("pluginName") in FILTERS:
        found.append(
            Config(where, "Istio WasmPlugin", spec["pluginName"], value=spec.get("pluginConfig", {}))
        )
    if kind == "EnvoyExtensionPolicy":
        for wasm in spec.get("wasm", []):
            if wasm.get("rootID") in FILTERS:
                found.append(
                    Config(
                        f"{where} {wasm.get('name')}",
                        "Envoy Gateway EnvoyExtensionPolicy",
                        wasm["rootID"],
                        value=wasm.get("config", {}),
                    )
                )
    if node.get("@type") == WASM_TYPE:
        config = node.get("config", {})
        if config.get("root_id") in FILTERS:
            text = (config.get("configuration") or {}).get("value", "")
            found.append(Config(f"{where} {config.get('name')}", "envoy wasm filter", config["root_id"], text=text))
    if node.get("@type") == NATIVE_TYPE and node.get("filter_name") in FILTERS:
        text = (node.get("filter_config") or {}).get("value", "")
        found.append(Config(where, "envoy dynamic module", node["filter_name"], text=text))
    for key, item in node.items():
        configs_in(item, f"{where}.{key}", found)


def shipped_configs():
    found = []
    for top in ("envoy", "examples"):
        for path in sorted((ROOT / top).rglob("*")):
            rel = str(path.relative_to(ROOT))
            if path.suffix in (".yaml", ".yml"):
                try:
                    docs = list(yaml.safe_load_all(source_of(path)))
                except yaml.YAMLError as e:
                    sys.exit(f"{rel}: not YAML (a template not rendered? run make render): {e}")
                for i, doc in enumerate(docs):
                    configs_in(doc, f"{rel}#{i}", found)
            elif path.suffix == ".json" and path.name.endswith("-config.json"):
                filter_name = "graceful_" + path.name.removesuffix("-config.json")
                if filter_name not in FILTERS:
                    sys.exit(f"{rel}: names no filter ({filter_name})")
                found.append(Config(rel, "config file", filter_name, text=path.read_text()))
    return found


class Parser:
    """graceful-core's parser, one JSON line per question."""

    def __init__(self, command):
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def parse(self, filter_name, text):
        self.process.stdin.write(json.dumps({"filter": filter_name, "text": text}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            sys.exit("the parser ended without answering")
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        if self.process.wait() != 0:
            sys.exit("the parser failed")


def schema_errors(validator, value):
    return [f"{'/'.join(map(str, e.absolute_path)) or '(document)'}: {e.message}" for e in validator.iter_errors(value)]


def check_shipped(validators, parser, failures):
    configs = shipped_configs()
    for where, kind, filter_name in EXPECTED:
        if not any(
            c.kind == kind and c.filter == filter_name and c.where.split("#")[0].rsplit("/", 1)[0] == where
            for c in configs
        ):
            failures.append(f"no {kind} config of {filter_name} found in {where}/")
    for c in configs:
        if "${" in c.text:
            failures.append(f"{c.where}: a template's placeholder; run make render first")
            continue
        errors = schema_errors(validators[c.filter], c.value())
        if errors:
            failures.append(f"{c.where} ({c.kind}, {c.filter}): schema refuses it: {errors}")
        answer = parser.parse(c.filter, c.text)
        if not answer["accepted"]:
            failures.append(f"{c.where} ({c.kind}, {c.filter}): parser refuses it: {answer}")
    return configs


def check_corpus(schemas, validators, parser, failures):
    corpus = json.loads((ROOT / "schema" / "tests" / "corpus.json").read_text())
    counts = {"good": 0, "bad": 0, "parser_only": 0}
    if sorted(corpus) != sorted(FILTERS):
        failures.append(f"the corpus names {sorted(corpus)}, not every filter")
    for filter_name in FILTERS:
        entries = corpus.get(filter_name, {})
        validator = validators[filter_name]
        for entry in entries.get("good", []):
            text = entry.get("text", json.dumps(entry.get("config")))
            label = f"{filter_name} good {text}"
            counts["good"] += 1
            answer = parser.parse(filter_name, text)
            if not answer["accepted"]:
                failures.append(f"{label}: parser refuses it: {answer}")
            errors = schema_errors(validator, json.loads(text))
            if errors:
                failures.append(f"{label}: schema refuses it: {errors}")
        used = set()
        for entry in entries.get("bad", []):
            text = entry.get("text", json.dumps(entry.get("config")))
            label = f"{filter_name} bad {text}"
            counts["bad"] += 1
            answer = parser.parse(filter_name, text)
            if answer["accepted"]:
                failures.append(f"{label}: parser accepts it")
            elif answer["field"] != entry["field"]:
                failures.append(f"{label}: parser names {answer['field']!r}, not {entry['field']!r} ({answer['reason']})")
            errors = schema_errors(validator, json.loads(text))
            rule = entry.get("parser_only")
            if rule is None and not errors:
                failures.append(f"{label}: schema accepts what the parser refuses ({answer.get('reason')})")
            if rule is not None:
                counts["parser_only"] += 1
                used.add(rule)
                if errors:
                    failures.append(f"{label}: marked parser-only ({rule}), yet the schema refuses it: {errors}")
        listed = {r["name"] for r in schemas[filter_name]["x-parser-only-rules"]}
        if used != listed:
            failures.append(
                f"{filter_name}: the schema lists parser-only rules {sorted(listed)}, "
                f"the corpus shows {sorted(used)}"
            )
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--parser",
        required=True,
        help="the command that runs the config_schema example (its `parse` is appended)",
    )
    args = ap.parse_args()
    schemas, validators = {}, {}
    for filter_name in FILTERS:
        schema = json.loads((ROOT / "schema" / f"{filter_name}.schema.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        schemas[filter_name] = schema
        validators[filter_name] = jsonschema.Draft202012Validator(schema)
    parser = Parser(shlex.split(args.parser) + ["parse"])
    failures = []
    configs = check_shipped(validators, parser, failures)
    counts = check_corpus(schemas, validators, parser, failures)
    parser.close()
    for failure in failures:
        print(f"FAIL {failure}")
    if failures:
        sys.exit(f"{len(failures)} failures")
    kinds = sorted({(c.kind, c.filter) for c in configs})
    print(
        f"schema ok: {len(configs)} shipped configs ({len(kinds)} kinds) pass schema and parser; "
        f"corpus: {counts['good']} good pass both, {counts['bad']} bad refused by the parser, "
        f"{counts['bad'] - counts['parser_only']} of them by the schema, {counts['parser_only']} "
        f"parser-only as listed"
    )


if __name__ == "__main__":
    main()
