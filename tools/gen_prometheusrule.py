#!/usr/bin/env python3
"""examples/prometheus/prometheusrule.yaml from examples/prometheus/rules.yaml.

The prometheus-operator's PrometheusRule carries the same groups as a plain
rule file under `spec`; one file is written from the other so the rules are
stated once.

    gen_prometheusrule.py write   # write prometheusrule.yaml
    gen_prometheusrule.py check   # fail if it differs from what write writes
"""

import sys

import yaml
from generated import ROOT, write_or_check

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
    return write_or_check(argv[1], OUT, text, "rules.yaml", "make rules")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
