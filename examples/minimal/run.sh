#!/usr/bin/env bash
# What `make minimal` runs: a test app on 127.0.0.1:8080 and Envoy on the
# minimal config in front of it, until Ctrl-C (or SIGTERM) stops both.
#
#   examples/minimal/run.sh ENVOY APP [CONFIG]
#
# ENVOY is an Envoy binary, APP the demo app (examples/demo-app), CONFIG the
# minimal config (default: envoy.yaml). Run it in the directory the config's
# .wasm paths are relative to: the one holding dist/ (the repository root
# after `make build`).
set -euo pipefail
usage="usage: examples/minimal/run.sh ENVOY APP [CONFIG]"
envoy=${1:?$usage}
app=${2:?$usage}
config=${3:-envoy.yaml}
for f in dist/graceful_provider.wasm dist/graceful_drain.wasm dist/graceful_consumer.wasm; do
  [[ -f $f ]] || { echo "minimal: no $PWD/$f: the config's .wasm paths are relative to the directory Envoy is started in (make build writes dist/)" >&2; exit 1; }
done

pids=() names=()
stop() {
  trap - EXIT INT TERM
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$app" --listen 127.0.0.1:8080 &
pids+=($!) names+=("the app")
# wasm:info: the filters' own lines (closing, the drain report); Envoy's at warn.
"$envoy" -c "$config" --concurrency 2 --disable-hot-restart \
  --log-level warn --component-log-level wasm:info &
pids+=($!) names+=(Envoy)

# Up once the outbound listener accepts (Envoy opens it after loading the filters).
for _ in $(seq 300); do
  for i in "${!pids[@]}"; do
    kill -0 "${pids[i]}" 2>/dev/null || { echo "minimal: ${names[i]} exited: see above" >&2; exit 1; }
  done
  if (exec 3<>/dev/tcp/127.0.0.1/15001) 2>/dev/null; then
    cat <<'EOF'
minimal: Envoy on the minimal config (admin 127.0.0.1:9901), the demo app on 127.0.0.1:8080
  curl -si localhost:15001/                             # graceful_consumer, graceful_drain, graceful_provider, the app
  curl -s -X POST localhost:15006/graceful/closing      # start a shutdown: the next answer says x-graceful-closing: true
  curl -s 'localhost:15006/graceful/drained?wait=10s'   # what a preStop waits for
  curl -s localhost:15006/graceful/report               # the drain report
Ctrl-C stops both.
EOF
    # Ctrl-C reaches the app and Envoy too: each stops and exits 0 (bash then
    # drops its own SIGINT), and this stops the other. Any other end is a fault.
    status=0
    wait -n || status=$?
    ((status == 0)) && { echo "minimal: stopped" >&2; exit 0; }
    echo "minimal: the app or Envoy exited with status $status: stopping both" >&2
    exit 1
  fi
  sleep 0.1
done
echo "minimal: Envoy did not open 127.0.0.1:15001 within 30 s" >&2
exit 1
