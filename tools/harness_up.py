#!/usr/bin/env python3
"""Waits until every provider of the docker harness serves through the consumer.

    harness_up.py [--deadline 120] [--consumer consumer] -- COMPOSE [ARGS...]

COMPOSE is the Compose command the Makefile runs, with its project and file
(`docker compose -p graceful-wasm -f envoy/docker-compose.yaml`, or
`docker-compose ...`: both are asked only what both answer). `make up` runs
this after `compose up -d`, which returns as soon as the containers exist:
the consumer may then meet a provider whose Envoy is not listening yet,
tombstone it for a refused connection (failure_tombstone_ttl, 5 s) and send
everything to the others meanwhile.

A provider is any service but the consumer; it is identified in an answer by
`x-served-by`, the `--name` its demo app runs with (read from the container's
command). Polls, until the deadline: a batch of requests through the
consumer's published listener, each on a new connection, until one batch has
been answered by every provider. Then prints where to send requests and
exits 0; at the deadline names each provider that did not answer, with its
container's state and last log lines, and exits 1.
Python 3 standard library only.
"""
import argparse
import collections
import http.client
import json
import subprocess
import sys
import time

# The container ports the generated compose file publishes (harness
# platform/compose.rs): the consumer's outbound listener and admin, each
# provider's inbound listener and admin.
CONSUMER_LISTENER = 15001
CONSUMER_ADMIN = 9902
PROVIDER_LISTENER = 15006
PROVIDER_ADMIN = 9901
IDENTITY_HEADER = "x-served-by"
# Between batches: the poll's pace, not a synchronisation.
POLL_INTERVAL = 0.25
REQUEST_TIMEOUT = 2.0


class Failed(Exception):
    """make up failed; the message says why, naming what did not come up."""


def run(argv):
    """A command's stdout, or Failed with its stderr."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as e:
        raise Failed(f"{argv[0]}: {e}") from None
    if out.returncode != 0:
        raise Failed(f"`{' '.join(argv)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def demo_app_name(cmd):
    """The `--name` a container's command gives the demo app, or None."""
    for i, arg in enumerate(cmd or []):
        if arg == "--name" and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith("--name="):
            return arg.split("=", 1)[1]
    return None


def host_port(published):
    """`compose port` output ("0.0.0.0:15001", maybe one line per address
    family) as (host, port) to connect to from this machine."""
    for line in published.split():
        host, _, port = line.rpartition(":")
        if port.isdigit():
            host = host.strip("[]")
            if host in ("", "0.0.0.0", "::"):
                host = "localhost"
            return host, int(port)
    return None


def served_by(host, port, requests):
    """Sends `requests` GETs, each on a new connection; counts the answers by
    their identity header ("" for none) and returns (counts, last error)."""
    counts = collections.Counter()
    error = None
    for _ in range(requests):
        conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT)
        try:
            conn.request("GET", "/")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                counts[response.getheader(IDENTITY_HEADER, "")] += 1
            else:
                error = f"HTTP {response.status}"
        except (OSError, http.client.HTTPException) as e:
            error = str(e) or type(e).__name__
        finally:
            conn.close()
    return counts, error


def wait_until_all_serve(expected, send_batch, deadline, clock=time.monotonic, pause=time.sleep):
    """Polls send_batch() (-> (Counter of names, last error)) until one batch
    holds every name in `expected`, or `deadline` (a clock() value) passes.
    Returns (True, batch) or (False, names seen in the last batch, last error)."""
    seen, error = collections.Counter(), None
    while True:
        seen, error = send_batch()
        if set(expected) <= set(seen):
            return True, seen, error
        if clock() >= deadline:
            return False, seen, error
        pause(POLL_INTERVAL)


class Harness:
    """The compose project, asked through the Makefile's Compose command."""

    def __init__(self, compose, consumer):
        self.compose = compose
        self.consumer = consumer

    def services(self):
        return run(self.compose + ["config", "--services"]).split()

    def container(self, service):
        ids = run(self.compose + ["ps", "-q", service]).split()
        if not ids:
            raise Failed(f"{service} has no container: did `compose up -d` start it?")
        return ids[0]

    def inspect(self, container):
        return json.loads(run(["docker", "inspect", container]))[0]

    def port(self, service, container_port):
        address = host_port(run(self.compose + ["port", service, str(container_port)]))
        if address is None:
            raise Failed(f"{service} publishes no port for {container_port}")
        return address

    def logs(self, container, lines=10):
        try:
            out = subprocess.run(["docker", "logs", "--tail", str(lines), container],
                                 capture_output=True, text=True, check=False)
            return (out.stdout + out.stderr).strip()
        except OSError:
            return ""


def provider_table(harness):
    """service -> (container id, container name, identity) for every provider."""
    providers = {}
    for service in harness.services():
        if service == harness.consumer:
            continue
        container = harness.container(service)
        info = harness.inspect(container)
        name = demo_app_name(info.get("Config", {}).get("Cmd"))
        if name is None:
            raise Failed(f"{service}: its command gives the demo app no --name, so no answer can name it")
        providers[service] = (container, info.get("Name", "").lstrip("/"), name)
    if not providers:
        raise Failed("the compose file has no provider service")
    return providers


def state(harness, container):
    """A container's state in a few words: running, and its healthcheck's verdict."""
    s = harness.inspect(container).get("State", {})
    health = (s.get("Health") or {}).get("Status")
    return s.get("Status", "unknown") + (f", health {health}" if health else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deadline", type=float, default=120.0,
                        help="seconds to wait for every provider (default 120)")
    parser.add_argument("--consumer", default="consumer", help="the consumer's service")
    parser.add_argument("--requests-per-provider", type=int, default=4,
                        help="a batch is this many requests per provider (default 4)")
    parser.add_argument("compose", nargs=argparse.REMAINDER, help="-- COMPOSE [ARGS...]")
    args = parser.parse_args()
    compose = args.compose[1:] if args.compose[:1] == ["--"] else args.compose
    if not compose:
        parser.error("give the Compose command after --")

    start = time.monotonic()
    harness = Harness(compose, args.consumer)
    try:
        providers = provider_table(harness)
        host, port = harness.port(args.consumer, CONSUMER_LISTENER)
        expected = {name for (_, _, name) in providers.values()}
        requests = args.requests_per_provider * len(providers)
        ok, seen, error = wait_until_all_serve(
            expected, lambda: served_by(host, port, requests), start + args.deadline)
        if not ok:
            lines = [f"make up: not every provider serves through the consumer at {host}:{port} "
                     f"after {args.deadline:.0f} s (last batch of {requests}: "
                     f"{dict(sorted(seen.items())) or 'no answer'}"
                     f"{'; last error: ' + error if error else ''})"]
            if not seen:
                consumer = harness.container(args.consumer)
                lines.append(f"  the consumer ({args.consumer}) answered nothing: container "
                             f"{state(harness, consumer)}; last log lines:")
                lines.extend("    " + l for l in harness.logs(consumer).splitlines())
            for service, (container, cname, name) in sorted(providers.items()):
                if name not in seen:
                    lines.append(f"  {service} ({IDENTITY_HEADER}: {name}) did not answer; "
                                 f"container {cname} {state(harness, container)}; last log lines:")
                    lines.extend("    " + l for l in harness.logs(container).splitlines())
            raise Failed("\n".join(lines))
    except Failed as e:
        print(e, file=sys.stderr)
        return 1

    took = time.monotonic() - start
    print(f"make up: every provider serves through the consumer ({took:.1f} s; last batch of "
          f"{sum(seen.values())}: " + ", ".join(f"{n} {c}" for n, c in sorted(seen.items())) + ")")
    print(f"  send requests:   curl -si http://{host}:{port}/    "
          f"(the answer's {IDENTITY_HEADER} names the provider)")
    try:
        ahost, aport = harness.port(args.consumer, CONSUMER_ADMIN)
        print(f"  consumer admin:  http://{ahost}:{aport}/stats?filter=graceful_consumer")
    except Failed:
        pass
    for service, (container, cname, name) in sorted(providers.items()):
        direct = []
        for label, container_port in (("direct", PROVIDER_LISTENER), ("admin", PROVIDER_ADMIN)):
            try:
                phost, pport = harness.port(service, container_port)
                direct.append(f"{label} http://{phost}:{pport}/")
            except Failed:
                pass
        print(f"  {service} ({name}): " + ", ".join(direct + [f"container {cname}"]))
    first = sorted(providers.items())[0][1][1]
    print(f"  a provider leaves gracefully: docker stop {first}; `make down` removes it all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
