"""Tests of harness_up.py: `python3 -m unittest discover -s tools` (make unit).

The end-to-end cases run the script as `make up` does, against a stand-in:
a Compose command and a `docker` on PATH that answer from a JSON file, and an
HTTP server on loopback as the consumer, answering as the providers it is
told are serving.
"""
import collections
import http.server
import itertools
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import unittest

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import harness_up  # noqa: E402


class Pure(unittest.TestCase):
    def test_the_demo_apps_name_is_read_from_its_command(self):
        cmd = ["/usr/local/bin/envoy", "-c", "x.yaml", "---", "/usr/local/bin/demo-app",
               "--listen", "127.0.0.1:8080", "--name", "p2", "--latency-ms", "5"]
        self.assertEqual(harness_up.demo_app_name(cmd), "p2")
        self.assertEqual(harness_up.demo_app_name(["demo-app", "--name=p7"]), "p7")
        self.assertIsNone(harness_up.demo_app_name(["envoy", "-c", "consumer.yaml"]))
        self.assertIsNone(harness_up.demo_app_name(["demo-app", "--name"]))
        self.assertIsNone(harness_up.demo_app_name(None))

    def test_a_published_port_is_reached_on_this_machine(self):
        self.assertEqual(harness_up.host_port("0.0.0.0:15001\n"), ("localhost", 15001))
        self.assertEqual(harness_up.host_port("0.0.0.0:15001\n[::]:15001\n"), ("localhost", 15001))
        self.assertEqual(harness_up.host_port("127.0.0.1:32768"), ("127.0.0.1", 32768))
        self.assertEqual(harness_up.host_port("[::]:9902"), ("localhost", 9902))
        self.assertIsNone(harness_up.host_port(":\n"))
        self.assertIsNone(harness_up.host_port(""))

    def test_the_wait_ends_at_the_first_batch_every_provider_answers(self):
        batches = iter([
            collections.Counter(p1=12),
            collections.Counter(p1=6, p3=6),
            collections.Counter(p1=4, p2=4, p3=4),
            collections.Counter(p1=12),
        ])
        clock = itertools.count()
        ok, seen, _ = harness_up.wait_until_all_serve(
            {"p1", "p2", "p3"}, lambda: (next(batches), None), deadline=100,
            clock=lambda: next(clock), pause=lambda _: None)
        self.assertTrue(ok)
        self.assertEqual(seen, collections.Counter(p1=4, p2=4, p3=4))

    def test_the_wait_gives_up_at_the_deadline_with_the_last_batch(self):
        now = [0.0]

        def pause(seconds):
            now[0] += seconds

        calls = []

        def batch():
            calls.append(now[0])
            return collections.Counter(p1=6, p3=6), "timed out"

        ok, seen, error = harness_up.wait_until_all_serve(
            {"p1", "p2", "p3"}, batch, deadline=2.0, clock=lambda: now[0], pause=pause)
        self.assertFalse(ok)
        self.assertNotIn("p2", seen)
        self.assertEqual(error, "timed out")
        # Polled at its interval until the deadline, not once, not forever.
        self.assertEqual(len(calls), int(2.0 / harness_up.POLL_INTERVAL) + 1)


class Consumer(http.server.ThreadingHTTPServer):
    """Answers GET / round-robin as the providers in `serving`."""

    def __init__(self):
        self.serving = []
        self.turn = itertools.count()
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        serving = self.server.serving
        if not serving:
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("x-served-by", serving[next(self.server.turn) % len(serving)])
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


STAND_IN = r'''#!/usr/bin/env python3
# A Compose command (argv[1] == "compose") or docker, answering from $HARNESS_STATE.
import json, os, sys
state = json.load(open(os.environ["HARNESS_STATE"]))
args = sys.argv[1:]
if args[:1] == ["compose"]:
    args = args[1:]
    while args and args[0] in ("-p", "-f"):
        args = args[2:]
    if args == ["config", "--services"]:
        print("\n".join(state["services"]))
    elif args[:2] == ["ps", "-q"]:
        print("id-" + args[2])
    elif args[0] == "port":
        port = state["ports"].get(args[1] + ":" + args[2])
        if port is None:
            sys.exit("no port")
        print("0.0.0.0:%d" % port)
    else:
        sys.exit("unexpected compose " + " ".join(args))
elif args[0] == "inspect":
    service = args[1][len("id-"):]
    print(json.dumps([{"Name": "/graceful-wasm_%s_1" % service,
                       "Config": {"Cmd": state["cmds"][service]},
                       "State": {"Status": "running", "Health": {"Status": state["health"][service]}}}]))
elif args[0] == "logs":
    print("log of " + args[-1])
else:
    sys.exit("unexpected docker " + " ".join(args))
'''


class EndToEnd(unittest.TestCase):
    def setUp(self):
        self.consumer = Consumer()
        threading.Thread(target=self.consumer.serve_forever, daemon=True).start()
        self.dir = tempfile.TemporaryDirectory()
        bin_dir = os.path.join(self.dir.name, "bin")
        os.mkdir(bin_dir)
        docker = os.path.join(bin_dir, "docker")
        with open(docker, "w") as f:
            f.write(STAND_IN)
        os.chmod(docker, os.stat(docker).st_mode | stat.S_IEXEC)
        self.env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"],
                        HARNESS_STATE=os.path.join(self.dir.name, "state.json"))
        providers = {f"provider{i}": ["envoy", "---", "demo-app", "--name", f"p{i}"] for i in (1, 2, 3)}
        self.state = {
            "services": ["provider1", "provider2", "provider3", "consumer"],
            "cmds": dict(providers, consumer=["-c", "consumer.yaml"]),
            "health": {"provider1": "healthy", "provider2": "starting",
                       "provider3": "healthy", "consumer": ""},
            "ports": {"consumer:15001": self.consumer.server_address[1],
                      "consumer:9902": 9902, "provider1:15006": 15011, "provider1:9901": 9911},
        }
        with open(self.env["HARNESS_STATE"], "w") as f:
            json.dump(self.state, f)

    def tearDown(self):
        self.consumer.shutdown()
        self.consumer.server_close()
        self.dir.cleanup()

    def up(self, deadline):
        return subprocess.run(
            [sys.executable, os.path.join(TOOLS, "harness_up.py"), "--deadline", str(deadline),
             "--", "docker", "compose", "-p", "graceful-wasm", "-f", "envoy/docker-compose.yaml"],
            capture_output=True, text=True, env=self.env, timeout=60)

    def test_it_returns_once_every_provider_answers_and_says_where_to_send_requests(self):
        self.consumer.serving = ["p1", "p3"]
        # p2 starts answering while the script polls.
        threading.Timer(0.5, lambda: self.consumer.serving.append("p2")).start()
        out = self.up(deadline=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        port = self.consumer.server_address[1]
        self.assertIn("every provider serves through the consumer", out.stdout)
        self.assertIn(f"curl -si http://127.0.0.1:{port}/", out.stdout.replace("localhost", "127.0.0.1"))
        self.assertRegex(out.stdout, r"last batch of 12: p1 \d+, p2 \d+, p3 \d+\)")
        self.assertIn("provider1 (p1): direct http://localhost:15011/, admin http://localhost:9911/", out.stdout)
        self.assertIn("docker stop graceful-wasm_provider1_1", out.stdout)

    def test_it_fails_naming_the_provider_that_never_answers(self):
        self.consumer.serving = ["p1", "p3"]
        out = self.up(deadline=1)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("provider2 (x-served-by: p2) did not answer", out.stderr)
        self.assertIn("health starting", out.stderr)
        self.assertIn("log of id-provider2", out.stderr)
        self.assertNotIn("provider1 (x-served-by", out.stderr)
        self.assertNotIn("provider3 (x-served-by", out.stderr)

    def test_a_consumer_that_answers_nothing_is_named_too(self):
        self.consumer.serving = []
        out = self.up(deadline=0.5)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("the consumer (consumer) answered nothing", out.stderr)
        self.assertIn("HTTP 503", out.stderr)
        for i in (1, 2, 3):
            self.assertIn(f"provider{i} (x-served-by: p{i}) did not answer", out.stderr)

    def test_a_provider_with_no_name_is_refused_at_once(self):
        self.state["cmds"]["provider2"] = ["envoy", "---", "demo-app"]
        with open(self.env["HARNESS_STATE"], "w") as f:
            json.dump(self.state, f)
        self.consumer.serving = ["p1", "p2", "p3"]
        out = self.up(deadline=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn("provider2: its command gives the demo app no --name", out.stderr)


if __name__ == "__main__":
    unittest.main()
