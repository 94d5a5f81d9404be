"""xds_server.py's protocol, driven by a gRPC client: delta xDS (what changed, what was removed,
wildcard and named subscriptions, a reconnect's known versions, a node's own resources) and
state of the world. Needs the server's Python (`make xds-tools`); `make unit` runs it with it:

    .venv/xds/bin/python -m unittest discover -s tools -p 'xds_server_test.py'
"""

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ENDPOINTS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
DEADLINE = 10.0


def listener(name, port):
    return {"@type": LISTENER, "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}


def endpoints(cluster, port):
    return {"@type": ENDPOINTS, "cluster_name": cluster, "endpoints": [{"lb_endpoints": [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                     "port_value": port}}}}]}]}


class Stream:
    """One ADS stream: requests go in through a queue, responses come back one at a time."""

    def __init__(self, call, channel):
        self.requests = queue.Queue()
        self.responses = call(iter(self.requests.get, None))
        self.channel = channel
        self.inbox = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for r in self.responses:
                self.inbox.put(r)
        except grpc.RpcError:
            pass

    def send(self, request):
        self.requests.put(request)

    def next(self, timeout=DEADLINE):
        return self.inbox.get(timeout=timeout)

    def nothing_within(self, seconds):
        try:
            r = self.inbox.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected response: {r}")

    def close(self):
        self.requests.put(None)
        self.responses.cancel()


class XdsServerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.snapshot = os.path.join(self.dir.name, "snapshot.json")
        self.version = 0
        port_file = os.path.join(self.dir.name, "port")
        self.log = open(os.path.join(self.dir.name, "log"), "w+")
        self.server = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "xds_server.py"), "--snapshot", self.snapshot,
             "--port-file", port_file], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + DEADLINE
        while not os.path.exists(port_file):
            self.assertIsNone(self.server.poll(), "the server exited")
            self.assertLess(time.monotonic(), deadline, "the server did not serve")
            time.sleep(0.05)
        with open(port_file) as f:
            self.channel = grpc.insecure_channel(f"127.0.0.1:{f.read().strip()}")
        self.stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        self.streams = []

    def tearDown(self):
        for s in self.streams:
            s.close()
        self.channel.close()
        self.server.kill()
        self.server.wait()
        self.log.close()
        self.dir.cleanup()

    def push(self, resources, nodes=None):
        self.version += 1
        tmp = self.snapshot + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"version": str(self.version), "resources": resources,
                       "nodes": nodes or {}}, f)
        os.replace(tmp, self.snapshot)

    def delta(self):
        s = Stream(self.stub.DeltaAggregatedResources, self.channel)
        self.streams.append(s)
        return s

    def names(self, response):
        return sorted(r.name for r in response.resources)

    def test_delta_sends_what_changed_and_the_names_of_what_is_gone(self):
        self.push({LISTENER: [listener("a", 1), listener("b", 2)]})
        s = self.delta()
        s.send(discovery_pb2.DeltaDiscoveryRequest(
            type_url=LISTENER, node={"id": "n1"}))
        first = s.next()
        self.assertEqual(self.names(first), ["a", "b"])
        self.assertEqual(first.system_version_info, "1")
        self.assertEqual(list(first.removed_resources), [])
        s.send(discovery_pb2.DeltaDiscoveryRequest(type_url=LISTENER,
                                                   response_nonce=first.nonce))
        # a unchanged, b gone, c new.
        self.push({LISTENER: [listener("a", 1), listener("c", 3)]})
        second = s.next()
        self.assertEqual(self.names(second), ["c"])
        self.assertEqual(list(second.removed_resources), ["b"])
        # A push that changes nothing for the stream sends nothing; the next that does is
        # the next response.
        self.push({LISTENER: [listener("a", 1), listener("c", 3)]})
        self.push({LISTENER: [listener("a", 1), listener("c", 4)]})
        third = s.next()
        self.assertEqual((self.names(third), third.system_version_info), (["c"], "4"))

    def test_named_subscriptions_get_only_their_names_and_a_reconnect_only_what_it_lacks(self):
        self.push({ENDPOINTS: [endpoints("x", 1), endpoints("y", 2)]})
        s = self.delta()
        s.send(discovery_pb2.DeltaDiscoveryRequest(
            type_url=ENDPOINTS, node={"id": "n1"}, resource_names_subscribe=["x"]))
        first = s.next()
        self.assertEqual(self.names(first), ["x"])
        x_version = first.resources[0].version
        # y changes: not subscribed, nothing sent; then subscribed, sent.
        self.push({ENDPOINTS: [endpoints("x", 1), endpoints("y", 3)]})
        self.assertTrue(s.nothing_within(0.5))
        s.send(discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINTS,
                                                   resource_names_subscribe=["y"]))
        self.assertEqual(self.names(s.next()), ["y"])
        # A new stream that holds x at its version gets y alone.
        again = self.delta()
        again.send(discovery_pb2.DeltaDiscoveryRequest(
            type_url=ENDPOINTS, node={"id": "n1"}, resource_names_subscribe=["x", "y"],
            initial_resource_versions={"x": x_version}))
        self.assertEqual(self.names(again.next()), ["y"])

    def test_each_node_gets_the_shared_resources_and_its_own(self):
        self.push({LISTENER: [listener("shared", 1)]},
                  nodes={"n1": {LISTENER: [listener("own1", 2)]},
                         "n2": {LISTENER: [listener("own2", 3)]}})
        got = {}
        for node in ["n1", "n2", "n3"]:
            s = self.delta()
            s.send(discovery_pb2.DeltaDiscoveryRequest(type_url=LISTENER, node={"id": node}))
            got[node] = self.names(s.next())
        self.assertEqual(got, {"n1": ["own1", "shared"], "n2": ["own2", "shared"],
                               "n3": ["shared"]})

    def test_state_of_the_world_sends_every_resource_of_the_type_at_each_version(self):
        self.push({LISTENER: [listener("a", 1), listener("b", 2)]})
        s = Stream(self.stub.StreamAggregatedResources, self.channel)
        self.streams.append(s)
        s.send(discovery_pb2.DiscoveryRequest(type_url=LISTENER, node={"id": "n1"}))
        first = s.next()
        self.assertEqual((first.version_info, len(first.resources)), ("1", 2))
        self.push({LISTENER: [listener("a", 1)]})
        second = s.next()
        self.assertEqual((second.version_info, len(second.resources)), ("2", 1))


if __name__ == "__main__":
    unittest.main()
