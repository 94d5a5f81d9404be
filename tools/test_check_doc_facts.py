"""tools/check_doc_facts.py passes on this repository, and fails, naming the
fact, when each disagreement it was written for is put back into a copy:
the ones issue 53 listed, and the ones found while fixing them. Run by
`make unit` (python3 -m unittest discover -s tools -p 'test_*.py')."""

import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_doc_facts  # noqa: E402
import gen_config_reference  # noqa: E402

ROOT = check_doc_facts.ROOT

# Put back wherever the text is now (the default: its first place).
ALL = -1
# (what it was, the file, the text now, the text put back, the fact or check
# whose name the failure must carry[, ALL])
PUT_BACK = [
    (
        "max_retries back at Envoy's default 3",
        "docs/configuration/envoy-versions.md",
        "now has it at Istio's default (4294967295)",
        "now has it back at Envoy's default 3",
        "max-retries",
    ),
    (
        "the steered request's hostcalls against 6 and 1 (mesh.md)",
        "docs/benchmarks/mesh.md",
        "against the ordinary request's 7 and 1",
        "against the ordinary request's 6 and 1",
        "hostcalls-steered",
    ),
    (
        "mesh.md's old sentence, 10 hostcalls against 6 and 1",
        "docs/benchmarks/mesh.md",
        "is 11 hostcalls, 2 returning data, against the ordinary request's 7 and 1",
        "is 10 hostcalls, 2 returning data, against 6 and 1",
        "hostcalls-steered",
    ),
    (
        "an ordinary consumer's hostcalls 6 / 1 and 8 / 2 (where-it-goes.md)",
        "docs/benchmarks/where-it-goes.md",
        "(7 / 1 with `admin_cluster`, 9 / 2 without)",
        "(6 / 1 with `admin_cluster`, 8 / 2 without)",
        "hostcalls-ordinary",
    ),
    (
        "the steered rows' old 10 / 12 / 12",
        "docs/benchmarks/where-it-goes.md",
        "| **11** | **2** |",
        "| **10** | **2** |",
        "hostcalls-steered",
    ),
    (
        "an ordinary consumer's hostcalls (count.md)",
        "docs/benchmarks/count.md",
        "4 entries and 7 hostcalls",
        "4 entries and 9 hostcalls",
        "hostcalls-ordinary",
    ),
    (
        "OLDEST_SUITES without xds and front (envoy-versions.md)",
        "docs/configuration/envoy-versions.md",
        "`drain_report`, `scale_down`,\n`xds` and `front`.",
        "`drain_report` and `scale_down`.",
        "oldest-suites",
    ),
    (
        "OLDEST_SUITES without front (make-targets.md)",
        "docs/development/make-targets.md",
        "`scale_down`, `xds`, `front`)",
        "`scale_down`, `xds`)",
        "oldest-suites",
    ),
    (
        "the native module on 1.39 and 1.40 (envoy-versions.md)",
        "docs/configuration/envoy-versions.md",
        "runs on 1.40 only",
        "runs on 1.39 and 1.40 only",
        "native-minors",
    ),
    (
        "the native module where it runs, 1.39 and 1.40 (make-targets.md)",
        "docs/development/make-targets.md",
        "where it runs (1.40)",
        "where it runs (1.39 and 1.40)",
        "native-minors",
    ),
    (
        "make demo about 10 min (the Makefile's help)",
        "Makefile",
        "(about 17 min",
        "(about 10 min",
        "demo-time",
    ),
    (
        "make demo about 10 min (the README)",
        "README.md",
        "`make demo` about 17 minutes",
        "`make demo` about 10 minutes",
        "demo-time",
    ),
    (
        "test-tools without prometheus",
        "docs/development/make-targets.md",
        "iproute2, prometheus (Debian)",
        "iproute2 (Debian)",
        "test-tools-packages",
    ),
    (
        "tests.md without prometheus.rs",
        "docs/development/tests.md",
        "prometheus.rs`",
        "prometheus suite`",
        "tests-listed",
        ALL,
    ),
    (
        "tests.md without front.rs",
        "docs/development/tests.md",
        "front.rs`",
        "front suite`",
        "tests-listed",
        ALL,
    ),
    (
        "a suite said to run on both deliveries that NATIVE_SUITES lacks",
        "docs/development/tests.md",
        "| deployment | `harness/tests/{istio_sidecar,oci,",
        "| deployment | (both deliveries) `harness/tests/{istio_sidecar,oci,",
        "native-suites",
    ),
    (
        "examples/README.md without minimal",
        "examples/README.md",
        "| [`minimal`](minimal/) |",
        "| minimal |",
        "examples-index",
    ),
    (
        "examples/README.md without prometheus",
        "examples/README.md",
        "| [`prometheus`](prometheus/README.md) |",
        "| prometheus |",
        "examples-index",
    ),
    (
        "examples/README.md without grafana",
        "examples/README.md",
        "| [`grafana`](grafana/README.md) |",
        "| grafana |",
        "examples-index",
    ),
    (
        "examples/README.md without argo-rollouts",
        "examples/README.md",
        "| [`argo-rollouts`](argo-rollouts/README.md) |",
        "| argo-rollouts |",
        "examples-index",
    ),
    (
        "examples/README.md without envoy-gateway's front-drain",
        "examples/README.md",
        "`front-drain.yaml`: the gateway",
        "the gateway",
        "examples-index",
    ),
    (
        "examples/README.md without istio's waypoint",
        "examples/README.md",
        "`waypoint-wasmplugin.yaml`: graceful_consumer",
        "graceful_consumer",
        "examples-index",
    ),
    (
        "a broken table in alerting.md (a row after a blank line)",
        "docs/operations/alerting.md",
        "\n| `GracefulEvictionsFarAboveBaseline` (info)",
        "\n\n| `GracefulEvictionsFarAboveBaseline` (info)",
        "alerts",
    ),
    (
        "a legend for a row the table lacks (demo.md: graceful_no_admin in today)",
        "docs/benchmarks/demo.md",
        "| today | graceful_no_admin | http1 | 11261 | 0 | 0 | 3.1 s | 0 | 7.5 | 9.7 | 77.2 |\n",
        "",
        "demo-table",
    ),
    (
        "a legend placing an approach where no cell ran it",
        "docs/benchmarks/demo.md",
        "in `today` and `scale_down` |",
        "in `today`, `istio_long` and `scale_down` |",
        "demo-legend",
    ),
    (
        "a run's cell count (demo.md)",
        "docs/benchmarks/demo.md",
        "39 cells in 1030 s",
        "22 cells in 1030 s",
        "demo-run-size",
    ),
    (
        "(added) in the configuration reference",
        "docs/configuration.md",
        "| `readmit_slow_start` | object | none | A host",
        "| `readmit_slow_start` | object | none | (added) A host",
        "internal-vocabulary",
    ),
    (
        "added to the contract",
        "docs/filters/consumer.md",
        "(off by default;",
        "(added to the contract;",
        "internal-vocabulary",
    ),
    (
        "issue 23 in the benchmarks pages",
        "docs/benchmarks/targets.md",
        "ordinary set (+10 before)",
        "ordinary set (issue 23; +10 before)",
        "internal-vocabulary",
    ),
    (
        "issue 21 in the benchmarks pages",
        "docs/benchmarks/where-it-goes.md",
        "(a steering fix:",
        "(the steering fix of issue 21:",
        "internal-vocabulary",
    ),
    (
        "a set's counted instructions against bench/results/count.json",
        "docs/benchmarks/count.md",
        "| `consumer` | 193,193 | +41,510 |",
        "| `consumer` | 193,139 | +41,510 |",
        "bench-count",
    ),
    (
        "a call's price against bench/results/prices.json",
        "docs/benchmarks/count.md",
        "| `header_map` | 15,814 |",
        "| `header_map` | 15,841 |",
        "bench-prices",
    ),
    (
        "the native module loading on 1.39 and 1.40 (native.md)",
        "docs/deploy/native.md",
        "It loads only on an Envoy of that ABI, 1.40,",
        "It loads only on an Envoy of that ABI, 1.39 and 1.40,",
        "native-minors",
    ),
    (
        "a field's default against the schema (docker.md)",
        "docs/deploy/docker.md",
        "`consumer_update_wait` (default 3 s)",
        "`consumer_update_wait` (default 5 s)",
        "field-default",
    ),
    (
        "a field said off by default that is on",
        "docs/benchmarks/count.md",
        "(`evict_on_connect_failure`, on by default)",
        "(`evict_on_connect_failure`, off by default)",
        "field-default",
    ),
    (
        "the tombstone alert's default against the schema",
        "docs/operations/alerting.md",
        "(900 of the default 1024)",
        "(900 of the default 1000)",
        "tombstones-alert",
    ),
]
# What the check reads (and nothing it does not, to keep the copy small).
COPIED = [
    "Makefile",
    "README.md",
    "docs",
    "schema",
    "envoy",
    "examples",
    "emulator/tests/abi_cost.rs",
    "harness/tests",
    "bench/results/count.json",
    "bench/results/prices.json",
]


class CheckDocFacts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.copy = Path(cls.tmp.name) / "repo"
        for part in COPIED:
            src, dst = ROOT / part, cls.copy / part
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("target", "*.svg"))
            else:
                shutil.copy2(src, dst)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_passes_on_this_repository(self):
        self.assertEqual(check_doc_facts.problems_in(ROOT), [])

    def test_every_fact_reads_its_source(self):
        for fact in check_doc_facts.FACTS:
            with self.subTest(fact=fact.name, doc=fact.doc):
                self.assertTrue(all(fact.source(ROOT)), fact.what)

    def test_fails_naming_each_disagreement_put_back(self):
        for what, doc, now, back, name, *places in PUT_BACK:
            with self.subTest(what):
                path = self.copy / doc
                original = path.read_text()
                self.assertIn(now, original, f"{doc} no longer says {now!r}: update this case")
                path.write_text(original.replace(now, back, places[0] if places else 1))
                try:
                    problems = check_doc_facts.problems_in(self.copy)
                finally:
                    path.write_text(original)
                self.assertTrue(
                    any(p.startswith(doc) and f" {name}:" in p for p in problems),
                    f"{what}: expected a problem naming {name} in {doc}, got {problems}",
                )

    def test_the_reference_generator_refuses_internal_vocabulary(self):
        for text in ["(added) A host readmitted", "Refused (added to the contract's peer fields)", "See issue 21."]:
            with self.subTest(text), self.assertRaises(SystemExit):
                gen_config_reference.described("readmit_slow_start", text)
        self.assertEqual(gen_config_reference.described("x", "A host readmitted."), "A host readmitted.")


if __name__ == "__main__":
    unittest.main()
