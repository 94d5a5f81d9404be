#!/usr/bin/env python3
"""examples/grafana/graceful-wasm.json: the operators' dashboard, built with
Grafana's own typed builders (grafana-foundation-sdk, Grafana 11.6's schema),
so every field is one Grafana defines.

Per workload (namespace and app, as the recording rules in
examples/prometheus/rules.yaml sum): phase, drain time, forced passes, late
callers, tombstones, steered requests. harness/tests/prometheus.rs runs every
panel's query against a real Prometheus beside real shutdowns.

    gen_dashboard.py write   # write the JSON
    gen_dashboard.py check   # fail if it differs from what write writes
    gen_dashboard.py exprs   # the panels' queries, one per line, as Prometheus gets them
"""

import json
import sys

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh
from generated import ROOT, write_or_check

OUT = ROOT / "examples" / "grafana" / "graceful-wasm.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# A workload's series, as the variables pick them.
SEL = 'namespace=~"$namespace", app=~"$app"'


def query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def build() -> dict:
    variables = [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dashboard.QueryVariable("namespace")
        .label("Namespace")
        .datasource(DATASOURCE)
        .query("label_values(graceful_drain_phase, namespace)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True),
        dashboard.QueryVariable("app")
        .label("Workload")
        .datasource(DATASOURCE)
        .query('label_values(graceful_drain_phase{namespace=~"$namespace"}, app)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True),
    ]
    panels = [
        (
            "Phase (pods closing, drained)",
            "graceful_drain_phase per pod: 0 serving, 1 closing, 2 drained (the gate passed).",
            "none",
            [query(f"max by (namespace, app, pod) (graceful_drain_phase{{{SEL}}})", "{{pod}}")],
        ),
        (
            "Drain time (closing to the gate's pass)",
            "The longest closing-to-pass time of the workload's last shutdowns (graceful_drain_drained_after_ms); "
            "consumer_update_wait plus a quiet window when nothing is late.",
            "s",
            [query(f"namespace_app:graceful_drain_drained_after_seconds:max{{{SEL}}}", "{{namespace}}/{{app}}")],
        ),
        (
            "Forced passes",
            "Shutdowns a timeout passed (step_timeout, or the overall timeout), per hour: each alerts; "
            "its drain report says what was late.",
            "short",
            [
                query(f"sum by (namespace, app) (increase(graceful_drain_passed_step_timeout{{{SEL}}}[1h]))", "step_timeout {{app}}"),
                query(f"sum by (namespace, app) (increase(graceful_drain_passed_timeout{{{SEL}}}[1h]))", "timeout {{app}}"),
                query(f"sum by (namespace, app) (increase(graceful_drain_passed_quiet{{{SEL}}}[1h]))", "quiet {{app}}"),
            ],
        ),
        (
            "Late callers",
            "Callers still sending after consumer_update_wait in the current shutdown (graceful_drain_late_peers); "
            "the drain report names them.",
            "short",
            [query(f"namespace_app:graceful_drain_late_peers:max{{{SEL}}}", "{{namespace}}/{{app}}")],
        ),
        (
            "Tombstones (consumers)",
            "Hosts the workload's consumer proxies keep out (graceful_consumer_tombstones), per pod.",
            "short",
            [query(f"max by (namespace, app, pod) (graceful_consumer_tombstones{{{SEL}}})", "{{pod}}")],
        ),
        (
            "Steered requests and evictions (consumers)",
            "Requests given an override list, and hosts tombstoned, per second.",
            "reqps",
            [
                query(f"namespace_app:graceful_consumer_steered:rate5m{{{SEL}}}", "steered {{app}}"),
                query(f"namespace_app:graceful_consumer_evictions:rate5m{{{SEL}}}", "evictions {{app}}"),
            ],
        ),
    ]
    board = (
        dashboard.Dashboard("graceful-wasm: shutdowns")
        .uid("graceful-wasm")
        .tags(["graceful-wasm", "envoy"])
        .description("Graceful shutdowns of the workloads behind graceful-wasm's filters (examples/grafana).")
        .refresh("30s")
        .time("now-6h", "now")
    )
    for v in variables:
        board = board.with_variable(v)
    for title, description, unit, targets in panels:
        panel = timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
        panel = panel.height(8).span(12)
        for ref, t in zip("ABCDEFGH", targets):
            panel = panel.with_target(t.ref_id(ref))
        board = board.with_panel(panel)
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build()))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def exprs(doc: dict) -> list[str]:
    return [t["expr"] for p in doc.get("panels", []) for t in p.get("targets", [])]


def main(argv: list[str]) -> int:
    if argv[1:] not in (["write"], ["check"], ["exprs"]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    text = render()
    if argv[1] == "exprs":
        print("\n".join(exprs(json.loads(text))))
        return 0
    return write_or_check(argv[1], OUT, text, "tools/gen_dashboard.py", "make dashboard")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
