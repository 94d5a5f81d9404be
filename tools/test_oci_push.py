"""Tests of oci_push.py: `python3 -m unittest discover -s tools` (make unit).

A `skopeo` on PATH stands in for the registry: `inspect --raw` answers from
a JSON file of image -> manifest bytes (or an error), `copy` records what it
was asked and writes the digest file as skopeo does. The layouts are
tools/oci.py's own.
"""
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import oci_push  # noqa: E402

FILTERS = ["graceful_provider", "graceful_drain"]
REGISTRY = "127.0.0.1:5000/graceful-wasm"

STAND_IN = r'''#!/usr/bin/env python3
import json, os, sys
state_path = os.environ["REGISTRY_STATE"]
state = json.load(open(state_path))
args = sys.argv[1:]
state.setdefault("calls", []).append(args)
json.dump(state, open(state_path, "w"))
if args[0] == "inspect":
    image = args[-1][len("docker://"):]
    if state.get("error"):
        sys.exit(state["error"])
    if image not in state["images"]:
        sys.exit('time="x" level=fatal msg="Error parsing image name: reading manifest 0.2.0 in %s: manifest unknown"' % image)
    sys.stdout.write(state["images"][image])
elif args[0] == "copy":
    digestfile = args[args.index("--digestfile") + 1]
    layout, tag = args[-2][len("oci:"):].rsplit(":", 1)
    index = json.load(open(os.path.join(layout, "index.json")))
    open(digestfile, "w").write(index["manifests"][0]["digest"])
'''


class Push(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        for f in FILTERS:
            with open(os.path.join(d, f"{f}.wasm"), "wb") as fh:
                fh.write(b"\0asm\1\0\0\0" + f.encode())
        subprocess.run([sys.executable, os.path.join(TOOLS, "oci.py"), "--dist", d,
                        "--out", os.path.join(d, "oci"), "--tag", "0.2.0", *FILTERS],
                       check=True, capture_output=True)
        bin_dir = os.path.join(d, "bin")
        os.mkdir(bin_dir)
        skopeo = os.path.join(bin_dir, "skopeo")
        with open(skopeo, "w") as fh:
            fh.write(STAND_IN)
        os.chmod(skopeo, os.stat(skopeo).st_mode | stat.S_IEXEC)
        self.state_path = os.path.join(d, "registry.json")
        self.env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"],
                        REGISTRY_STATE=self.state_path)
        self.write({"images": {}})

    def tearDown(self):
        self.dir.cleanup()

    def write(self, state):
        with open(self.state_path, "w") as f:
            json.dump(state, f)

    def state(self):
        with open(self.state_path) as f:
            return json.load(f)

    def manifest(self, f):
        layout = os.path.join(self.dir.name, "oci", f)
        with open(os.path.join(layout, "index.json")) as fh:
            digest = json.load(fh)["manifests"][0]["digest"]
        with open(os.path.join(layout, "blobs", "sha256", digest.split(":")[1])) as fh:
            return digest, fh.read()

    def push(self, flags="--dest-tls-verify=false"):
        return subprocess.run(
            [sys.executable, os.path.join(TOOLS, "oci_push.py"), "--registry", REGISTRY,
             "--tag", "0.2.0", f"--flags={flags}", "--oci", os.path.join(self.dir.name, "oci"),
             *FILTERS], capture_output=True, text=True, env=self.env)

    def copies(self):
        return [c for c in self.state()["calls"] if c[0] == "copy"]

    def test_absent_tags_are_pushed_and_each_push_is_printed_with_its_digest(self):
        out = self.push()
        self.assertEqual(out.returncode, 0, out.stderr)
        for f in FILTERS:
            digest, _ = self.manifest(f)
            self.assertIn(f"pushed {REGISTRY}/{f}:0.2.0@{digest}", out.stdout)
        self.assertEqual(len(self.copies()), 2)
        inspect = next(c for c in self.state()["calls"] if c[0] == "inspect")
        self.assertIn("--tls-verify=false", inspect)

    def test_a_tag_holding_this_very_build_is_left_alone(self):
        digest, manifest = self.manifest("graceful_provider")
        self.write({"images": {f"{REGISTRY}/graceful_provider:0.2.0": manifest}})
        out = self.push()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"already pushed {REGISTRY}/graceful_provider:0.2.0@{digest}", out.stdout)
        self.assertEqual([c[-1] for c in self.copies()], [f"docker://{REGISTRY}/graceful_drain:0.2.0"])

    def test_a_tag_holding_another_build_is_refused_and_nothing_is_pushed(self):
        _, other = self.manifest("graceful_provider")
        # graceful_drain:0.2.0 already holds a different image (the provider's).
        self.write({"images": {f"{REGISTRY}/graceful_drain:0.2.0": other}})
        out = self.push()
        self.assertEqual(out.returncode, 1, out.stdout)
        theirs = "sha256:" + hashlib.sha256(other.encode()).hexdigest()
        ours, _ = self.manifest("graceful_drain")
        self.assertIn(f"{REGISTRY}/graceful_drain:0.2.0 already holds {theirs}; this build is {ours}",
                      out.stderr)
        self.assertIn("bump", out.stderr)
        self.assertEqual(self.copies(), [], "the provider, looked up first, was not pushed either")

    def test_a_registry_that_cannot_say_gets_nothing_pushed(self):
        self.write({"images": {}, "error": "pinging container registry: connection refused"})
        out = self.push()
        self.assertEqual(out.returncode, 1)
        self.assertIn("cannot tell whether", out.stderr)
        self.assertIn("connection refused", out.stderr)
        self.assertEqual(self.copies(), [])

    def test_copy_flags_become_their_inspect_counterparts(self):
        self.assertEqual(oci_push.inspect_flags(["--dest-tls-verify=false"]), ["--tls-verify=false"])
        self.assertEqual(
            oci_push.inspect_flags(["--dest-creds", "u:p", "--retry-times", "3",
                                    "--dest-authfile=/a.json", "--dest-no-creds"]),
            ["--creds", "u:p", "--authfile=/a.json", "--no-creds"])
        self.assertEqual(oci_push.inspect_flags([]), [])


if __name__ == "__main__":
    unittest.main()
