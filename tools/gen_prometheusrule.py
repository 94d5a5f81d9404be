#!/usr/bin/env python3
"""examples/prometheus/prometheusrule.yaml from examples/prometheus/rules.yaml.

The prometheus-operator's PrometheusRule carries the same groups as a plain
rule file under `spec`; one file is written from the other so the rules are
stated once.

    gen_prometheusrule.py write   # write prometheusrule.yaml
    gen_prometheusrule.py check   # fail if it differs from what write writes
"""

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "examples" / "prometheus" / "rules.yaml"
OUT = ROOT / "examples" / "prometheus" / "prometheusrule.yaml"

HEADER = """\
# Generated from rules.yaml by tools/gen_prometheusrule.py (make rules): edit
# rules.yaml, not this file. The same rules for the prometheus-operator: its
# Prometheus picks them up where its ruleSelector matches these labels.
"""


def render(rules_text: str) -> str:
    groups = yaml.safe_load(rules_text)["groups"]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "graceful-wasm",
            "labels": {"app.kubernetes.io/name": "graceful-wasm", "role": "alert-rules"},
        },
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str]) -> int:
    if argv[1:] not in (["write"], ["check"]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    text = render(RULES.read_text())
    if argv[1] == "write":
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}")
        return 0
    if not OUT.exists() or OUT.read_text() != text:
        print(f"{OUT.relative_to(ROOT)} is not what rules.yaml makes: run make rules", file=sys.stderr)
        return 1
    print(f"{OUT.relative_to(ROOT)} matches rules.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
