#!/usr/bin/env python3
"""How long a provider sidecar's sockets stay open after SIGKILL.

Starts each provider config (plain Envoy, the wasm filters, the native
module) with one worker, opens an idle connection to its inbound listener,
sends the process SIGKILL and times how long until that connection is
closed (the kernel closes a dead process's sockets only once its memory is
freed). A request that reaches the
listener in that window is lost with the process (`make demo
SCENARIOS=killed`, docs/benchmarks/demo.md). Run from the repository root
after `make build native envoy render`:

    python3 tools/sigkill_close_ms.py [--runs 5]
"""
import argparse
import os
import signal
import socket
import subprocess
import time

CONFIGS = [
    ("plain", "target/envoy/baseline-provider-sidecar.yaml"),
    ("wasm", "target/envoy/provider-sidecar.yaml"),
    ("native", "envoy/native/provider-sidecar.yaml"),
]


def one_kill(config, port, admin):
    text = open(config).read()
    text = text.replace("port_value: 15006", f"port_value: {port}")
    text = text.replace("port_value: 9901", f"port_value: {admin}")
    path = f"target/sigkill-{port}.yaml"
    with open(path, "w") as f:
        f.write(text)
    envoy = subprocess.Popen(
        [".venv/envoy", "-c", path, "--concurrency", "1", "--disable-hot-restart", "-l", "error"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                envoy.kill()
                raise SystemExit(f"{config}: no listener on {port} within 20 s")
            time.sleep(0.05)
    time.sleep(1.0)
    conn.settimeout(5)
    killed = time.monotonic()
    os.kill(envoy.pid, signal.SIGKILL)
    try:
        conn.recv(1)
    except OSError:
        pass
    closed = time.monotonic()
    envoy.wait()
    return (closed - killed) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    port = 25000
    for name, config in CONFIGS:
        times = []
        for _ in range(args.runs):
            times.append(one_kill(config, port, port + 1000))
            port += 1
        closed = ", ".join(f"{c:.1f}" for c in times)
        print(f"{name:<6} socket closed after [{closed}] ms")


if __name__ == "__main__":
    main()
