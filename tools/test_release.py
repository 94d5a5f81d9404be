"""Tests of release.py and sbom.py: `python3 -m unittest discover -s tools` (make unit).

The checks run the script as `make release` does, in a scratch git repository;
the assembly runs on stand-in artifacts (small files, OCI layouts written by
tools/oci.py) with the workspace's own `cargo metadata` for the SBOM.
"""
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import unittest

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import release  # noqa: E402
import sbom  # noqa: E402

FILTERS = ["graceful_provider", "graceful_drain", "graceful_consumer"]
CHANGELOG = """# Changelog

## [Unreleased]

## [0.3.0] - 2027-01-01

### Added
- **Not breaking** (a new field): a thing users see.

## [0.2.0] - 2026-12-04

- older.

[0.3.0]: https://example.invalid/compare/v0.2.0...v0.3.0
"""


def read(path):
    with open(path) as f:
        return f.read()


def sh(cwd, *argv):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=True).stdout


class Checks(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.repo = self.dir.name
        sh(self.repo, "git", "init", "-q", "-b", "main")
        sh(self.repo, "git", "config", "user.email", "t@example.invalid")
        sh(self.repo, "git", "config", "user.name", "t")
        with open(os.path.join(self.repo, "CHANGELOG.md"), "w") as f:
            f.write(CHANGELOG)
        sh(self.repo, "git", "add", "CHANGELOG.md")
        sh(self.repo, "git", "commit", "-q", "-m", "first")

    def tearDown(self):
        self.dir.cleanup()

    def release(self, *args):
        return subprocess.run([sys.executable, os.path.join(TOOLS, "release.py"), *args],
                              cwd=self.repo, capture_output=True, text=True)

    def test_a_clean_tree_with_a_changelog_section_may_release(self):
        out = self.release("check", "--version", "0.3.0", "--tag", "0.3.0")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("tag v0.3.0 not yet created", out.stdout)

    def test_a_dirty_tree_is_refused_naming_the_files(self):
        with open(os.path.join(self.repo, "CHANGELOG.md"), "a") as f:
            f.write("edit\n")
        with open(os.path.join(self.repo, "stray.txt"), "w") as f:
            f.write("x\n")
        out = self.release("check", "--version", "0.3.0")
        self.assertEqual(out.returncode, 1)
        self.assertIn("the work tree is not clean", out.stderr)
        self.assertIn("CHANGELOG.md", out.stderr)
        self.assertIn("stray.txt", out.stderr)

    def test_a_version_tagged_on_another_commit_is_refused(self):
        sh(self.repo, "git", "tag", "-a", "v0.3.0", "-m", "x")
        sh(self.repo, "git", "commit", "-q", "--allow-empty", "-m", "later")
        out = self.release("check", "--version", "0.3.0")
        self.assertEqual(out.returncode, 1)
        self.assertIn("v0.3.0 already names", out.stderr)
        self.assertIn("bump", out.stderr)
        # A lightweight tag counts as much as an annotated one.
        sh(self.repo, "git", "tag", "v0.2.0", "HEAD~1")
        self.assertEqual(self.release("check", "--version", "0.2.0").returncode, 1)

    def test_a_version_tagged_on_head_may_be_built_again(self):
        sh(self.repo, "git", "tag", "-a", "v0.3.0", "-m", "x")
        out = self.release("check", "--version", "0.3.0")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("names HEAD", out.stdout)

    def test_a_version_without_a_changelog_section_is_refused(self):
        out = self.release("check", "--version", "0.4.0")
        self.assertEqual(out.returncode, 1)
        self.assertIn("CHANGELOG.md has no `## [0.4.0]` section", out.stderr)

    def test_a_tag_other_than_the_version_and_a_bad_version_are_refused(self):
        out = self.release("check", "--version", "0.3.0", "--tag", "latest")
        self.assertEqual(out.returncode, 1)
        self.assertIn("TAG=latest", out.stderr)
        for bad in ("0.3", "v0.3.0", "01.2.3", "0.3.0+build"):
            out = self.release("check", "--version", bad)
            self.assertEqual(out.returncode, 1, bad)
            self.assertIn("not a semantic version", out.stderr)

    def test_a_development_version_is_refused_in_one_line_naming_why(self):
        # main carries 0.3.0-dev: refused first, whatever else holds.
        with open(os.path.join(self.repo, "stray.txt"), "w") as f:
            f.write("x\n")
        for dev in ("0.3.0-dev", "0.3.0-dev.2"):
            out = self.release("check", "--version", dev)
            self.assertEqual(out.returncode, 1, dev)
            self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
            self.assertIn(f"make release: {dev} is a development version", out.stderr)
        self.assertTrue(release.development("0.3.0-dev"))
        self.assertFalse(release.development("0.3.0-rc.1") or release.development("0.3.0"))

    def test_a_changelog_section_without_a_date_is_refused(self):
        with open(os.path.join(self.repo, "CHANGELOG.md"), "a") as f:
            f.write("\n## [0.4.0]\n\n- soon.\n")
        sh(self.repo, "git", "commit", "-q", "-am", "undated")
        out = self.release("check", "--version", "0.4.0")
        self.assertEqual(out.returncode, 1)
        self.assertIn("`## [0.4.0]` has no date", out.stderr)
        self.assertIn("## [0.4.0] - YYYY-MM-DD", out.stderr)

    def test_a_section_with_an_unclassified_entry_is_refused(self):
        with open(os.path.join(self.repo, "CHANGELOG.md"), "a") as f:
            f.write("\n## [0.4.0] - 2027-02-01\n\n- **Breaking**: a.\n- b, unsaid.\n  more of b.\n")
        sh(self.repo, "git", "commit", "-q", "-am", "loose")
        out = self.release("check", "--version", "0.4.0")
        self.assertEqual(out.returncode, 1)
        self.assertIn("1 entry of CHANGELOG.md's `## [0.4.0]` say neither", out.stderr)
        self.assertIn("- b, unsaid.", out.stderr)

    def test_every_unreleased_entry_of_the_real_changelog_is_classified(self):
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            section = release.changelog_section("Unreleased")
        finally:
            os.chdir(cwd)
        self.assertIsNotNone(section)
        self.assertEqual(release.unclassified(section), [],
                         "mark each CHANGELOG.md entry **Breaking** or **Not breaking** (docs/releasing.md)")
        with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
            text = f.read()
        # Comparison links: Unreleased against the newest release's tag, each release its tag.
        versions = re.findall(r"^## \[(\d[^\]]*)\]", text, re.M)
        self.assertRegex(text, rf"(?m)^\[Unreleased\]: \S*/compare/v{re.escape(versions[0])}\.\.\.HEAD$")
        for v in versions:
            self.assertRegex(text, rf"(?m)^\[{re.escape(v)}\]: \S*/(compare/v\S+\.\.\.|releases/tag/)v{re.escape(v)}$")

    def test_tag_creates_the_annotated_tag_once(self):
        self.assertIsNone(subprocess.run(["git", "rev-parse", "-q", "--verify", "refs/tags/v0.3.0"],
                                         cwd=self.repo, capture_output=True).stdout.strip() or None)
        out = self.release("tag", "--version", "0.3.0")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("tagged v0.3.0", out.stdout)
        self.assertEqual(sh(self.repo, "git", "cat-file", "-t", "v0.3.0").strip(), "tag")
        self.assertEqual(sh(self.repo, "git", "rev-parse", "v0.3.0^{commit}"),
                         sh(self.repo, "git", "rev-parse", "HEAD"))
        again = self.release("tag", "--version", "0.3.0")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("already names HEAD", again.stdout)
        # A development version is never tagged.
        dev = self.release("tag", "--version", "0.4.0-dev")
        self.assertEqual(dev.returncode, 1)
        self.assertIn("development version", dev.stderr)

    def test_push_refuses_a_release_version_off_its_tag(self):
        # No tag yet: a release version's images are not pushed.
        out = self.release("push-check", "--version", "0.3.0", "--tag", "0.3.0")
        self.assertEqual(out.returncode, 1)
        self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        self.assertIn("make push: version 0.3.0 is a release, but HEAD", out.stderr)
        self.assertIn("v0.3.0 (which does not exist)", out.stderr)
        # On its tag: pushed.
        sh(self.repo, "git", "tag", "-a", "v0.3.0", "-m", "x")
        self.assertEqual(self.release("push-check", "--version", "0.3.0", "--tag", "0.3.0").returncode, 0)
        # A later commit: refused again, naming where the tag is.
        sh(self.repo, "git", "commit", "-q", "--allow-empty", "-m", "later")
        out = self.release("push-check", "--version", "0.3.0", "--tag", "0.3.0")
        self.assertEqual(out.returncode, 1)
        self.assertIn("(which names ", out.stderr)
        # A development version, or images under another tag, go anywhere.
        for version, tag in (("0.4.0-dev", "0.4.0-dev_abc"), ("0.4.0-dev", "0.4.0-dev"),
                             ("0.3.0", "e2e")):
            out = self.release("push-check", "--version", version, "--tag", tag)
            self.assertEqual(out.returncode, 0, (version, tag, out.stderr))
        # A release number given by hand on a development tree: refused.
        out = self.release("push-check", "--version", "0.4.0-dev", "--tag", "0.2.0")
        self.assertEqual(out.returncode, 1)
        self.assertIn("version 0.2.0 is a release number (this tree is 0.4.0-dev)", out.stderr)

    def test_the_changelog_section_is_the_versions_alone(self):
        os.chdir(self.repo)
        try:
            notes = release.changelog_section("0.3.0")
        finally:
            os.chdir(ROOT)
        self.assertTrue(notes.startswith("## [0.3.0] - 2027-01-01\n"), notes)
        self.assertIn("a thing users see", notes)
        self.assertNotIn("older", notes)
        self.assertNotIn("example.invalid", notes)


class Assemble(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.dist = os.path.join(self.dir.name, "dist")
        os.makedirs(self.dist)
        for f in FILTERS:
            with open(os.path.join(self.dist, f"{f}.wasm"), "wb") as fh:
                fh.write(b"\0asm\1\0\0\0" + f.encode())
        with open(os.path.join(self.dist, release.NATIVE), "wb") as fh:
            fh.write(b"\x7fELF stand-in")
        subprocess.run([sys.executable, os.path.join(TOOLS, "oci.py"), "--dist", self.dist,
                        "--out", os.path.join(self.dist, "oci"), "--tag", "0.3.0", *FILTERS],
                       check=True, capture_output=True)
        self.schemas = os.path.join(self.dir.name, "schema")
        os.makedirs(self.schemas)
        with open(os.path.join(self.schemas, "graceful_drain.schema.json"), "w") as fh:
            fh.write("{}\n")
        self.changelog = os.path.join(self.dir.name, "CHANGELOG.md")
        with open(self.changelog, "w") as fh:
            fh.write(CHANGELOG)

    def tearDown(self):
        self.dir.cleanup()

    def assemble(self, out, version="0.3.0"):
        cwd = os.getcwd()
        os.chdir(ROOT)  # cargo metadata and Cargo.lock are the workspace's
        try:
            return release.assemble(version, self.dist, out, FILTERS, self.schemas,
                                    changelog=self.changelog)
        finally:
            os.chdir(cwd)

    def test_every_artifact_is_listed_with_its_checksum_and_the_release_reproduces(self):
        out = os.path.join(self.dir.name, "release", "0.3.0")
        listed = self.assemble(out)
        names = [name for name, _, _ in listed]
        expected = sorted([f"{f}.wasm" for f in FILTERS] + [f"{f}.oci.tar" for f in FILTERS] +
                          ["libgraceful.so", "graceful_drain.schema.json", "RELEASE_NOTES.md",
                           "sbom.cdx.json"])
        self.assertEqual(names, expected)
        self.assertEqual(sorted(os.listdir(out)), sorted(expected + ["SHA256SUMS"]))
        check = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=out,
                               capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertEqual(check.stdout.count(": OK"), len(expected))
        first = read(os.path.join(out, "SHA256SUMS"))
        # A second assembly of the same inputs gives the same bytes (the tar,
        # the SBOM's time and serial number included).
        self.assemble(out)
        self.assertEqual(read(os.path.join(out, "SHA256SUMS")), first)

    def test_an_oci_archive_is_the_layout_as_skopeo_reads_it(self):
        out = os.path.join(self.dir.name, "release", "0.3.0")
        self.assemble(out)
        with tarfile.open(os.path.join(out, "graceful_drain.oci.tar")) as tar:
            members = tar.getmembers()
            names = [m.name for m in members]
            self.assertIn("oci-layout", names)
            self.assertIn("index.json", names)
            self.assertTrue(all((m.uid, m.gid, m.mtime, m.uname) == (0, 0, 0, "") for m in members))
            index = json.load(tar.extractfile("index.json"))
        digest = index["manifests"][0]["digest"]
        self.assertIn("blobs/sha256/" + digest.split(":")[1], names)
        self.assertEqual(index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"], "0.3.0")

    def test_the_sbom_names_each_artifact_and_the_crates_it_is_built_from(self):
        out = os.path.join(self.dir.name, "release", "0.3.0")
        listed = dict((n, d) for n, d, _ in self.assemble(out))
        doc = json.loads(read(os.path.join(out, "sbom.cdx.json")))
        self.assertEqual((doc["bomFormat"], doc["specVersion"]), ("CycloneDX", "1.5"))
        self.assertEqual(doc["metadata"]["component"]["version"], "0.3.0")
        by_ref = {c["bom-ref"]: c for c in doc["components"]}
        deps = {d["ref"]: d["dependsOn"] for d in doc["dependencies"]}
        self.assertEqual(len(by_ref), len(doc["components"]), "bom-refs are unique")
        for ref, on in deps.items():
            for r in on + [ref]:
                self.assertTrue(r in by_ref or r == "graceful-wasm@0.3.0", r)
        self.assertEqual(by_ref["file:graceful_provider.wasm"]["hashes"][0]["content"],
                         listed["graceful_provider.wasm"])
        provider = deps["file:graceful_provider.wasm"][0]
        self.assertTrue(provider.startswith("graceful-wasm:graceful-provider@"), provider)
        self.assertTrue(deps["file:libgraceful.so"][0].startswith("graceful-wasm:graceful-native@"))
        proxy_wasm = [r for r in by_ref if r.startswith("pkg:cargo/proxy-wasm@")]
        self.assertEqual(len(proxy_wasm), 1)
        self.assertEqual(by_ref[proxy_wasm[0]]["purl"], proxy_wasm[0])
        self.assertEqual(len(by_ref[proxy_wasm[0]]["hashes"][0]["content"]), 64)
        # Only what goes into the artifacts: no test or harness crate.
        for absent in ("proptest", "wasmtime", "tokio", "graceful-harness", "demo-app"):
            self.assertFalse(any(c["name"] == absent for c in doc["components"]), absent)

    def test_a_layout_tagged_otherwise_or_a_missing_artifact_is_refused(self):
        out = os.path.join(self.dir.name, "release", "0.4.0")
        with self.assertRaisesRegex(release.Refused, r"tagged '0.3.0', not 0.4.0"):
            self.assemble(out, version="0.4.0")
        os.remove(os.path.join(self.dist, "libgraceful.so"))
        with self.assertRaisesRegex(release.Refused, r"missing: .*libgraceful.so"):
            self.assemble(out)


class Annotations(unittest.TestCase):
    def test_an_image_names_the_version_and_commit_it_was_built_from(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "graceful_drain.wasm"), "wb") as fh:
                fh.write(b"\0asm\1\0\0\0")
            subprocess.run([sys.executable, os.path.join(TOOLS, "oci.py"), "--dist", d, "--out",
                            os.path.join(d, "oci"), "--tag", "0.3.0-dev_8ab842c0ffee",
                            "--version", "0.3.0-dev+8ab842c0ffee", "--revision", "8ab842c0ffee",
                            "graceful_drain"], check=True, capture_output=True)
            layout = os.path.join(d, "oci", "graceful_drain")
            with open(os.path.join(layout, "index.json")) as fh:
                digest = json.load(fh)["manifests"][0]["digest"].split(":")[1]
            with open(os.path.join(layout, "blobs", "sha256", digest)) as fh:
                annotations = json.load(fh)["annotations"]
        self.assertEqual(annotations["org.opencontainers.image.version"], "0.3.0-dev+8ab842c0ffee")
        self.assertEqual(annotations["org.opencontainers.image.revision"], "8ab842c0ffee")


class Sbom(unittest.TestCase):
    """The walk over a small resolve, written out."""

    def metadata(self):
        def pkg(name, ours=False):
            source = None if ours else sbom.CRATES_IO
            pid = f"path+file:///w/{name}#{name}@1.0.0" if ours else f"{sbom.CRATES_IO}#{name}@1.0.0"
            return {"id": pid, "name": name, "version": "1.0.0", "source": source,
                    "license": "MIT", "repository": None, "description": None}

        packages = [pkg("app", True), pkg("lib", True), pkg("serde"), pkg("proptest"), pkg("cc"),
                    pkg("unrelated")]
        packages[2]["license"] = "MIT/Apache-2.0"
        ids = {p["name"]: p["id"] for p in packages}

        def dep(name, kind):
            return {"name": name, "pkg": ids[name], "dep_kinds": [{"kind": kind, "target": None}]}

        nodes = [
            {"id": ids["app"], "deps": [dep("lib", None), dep("proptest", "dev"), dep("cc", "build")]},
            {"id": ids["lib"], "deps": [dep("serde", None)]},
            {"id": ids["serde"], "deps": []},
            {"id": ids["proptest"], "deps": [dep("unrelated", None)]},
            {"id": ids["cc"], "deps": []},
            {"id": ids["unrelated"], "deps": []},
        ]
        return {"packages": packages, "workspace_members": [ids["app"], ids["lib"]],
                "resolve": {"nodes": nodes}}

    def test_only_normal_dependencies_are_followed(self):
        with tempfile.NamedTemporaryFile() as artifact:
            artifact.write(b"x")
            artifact.flush()
            doc = sbom.bom("1.0.0", "abc", 0, [(artifact.name, "t", "app")],
                           {"t": self.metadata()}, {("serde", "1.0.0"): "ab" * 32})
        names = sorted(c["name"] for c in doc["components"] if c["type"] == "library")
        self.assertEqual(names, ["app", "lib", "serde"])
        deps = {d["ref"]: d["dependsOn"] for d in doc["dependencies"]}
        self.assertEqual(deps["graceful-wasm:app@1.0.0"], ["graceful-wasm:lib@1.0.0"])
        self.assertEqual(deps["graceful-wasm:lib@1.0.0"], ["pkg:cargo/serde@1.0.0"])
        serde = next(c for c in doc["components"] if c["name"] == "serde")
        self.assertEqual(serde["hashes"], [{"alg": "SHA-256", "content": "ab" * 32}])
        self.assertEqual(serde["licenses"], [{"expression": "MIT OR Apache-2.0"}])
        self.assertEqual(doc["metadata"]["timestamp"], "1970-01-01T00:00:00Z")


if __name__ == "__main__":
    unittest.main()
