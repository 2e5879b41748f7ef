#!/usr/bin/env bash
# Runs jetsched on this machine: nats-server (nats.conf), the registry, two schedulers, two
# workers, the alerter and the console, then applies the demo specs in deploy/examples/ and prints
# where to look.
# Ctrl-C stops everything it started. Safe to re-run: the JetStream store in .jetsched-local/
# is reused, specs are applied idempotently, and an already running local NATS is reused.
#
#   bash deploy/local.sh            # runs until Ctrl-C
#   bash deploy/local.sh --for 60   # stops by itself after 60 s (used by tests)
#
# Environment: JETSCHED_LOCAL_DIR (state and logs, default .jetsched-local),
# JETSCHED_BIN_DIR (use binaries already built there instead of building release ones).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

run_for=""
if [[ "${1:-}" == "--for" ]]; then
    run_for="${2:?--for needs a number of seconds}"
fi

state="${JETSCHED_LOCAL_DIR:-.jetsched-local}"
logs="$state/logs"
mkdir -p "$logs"
: >"$state/pids"

# shellcheck source=deploy/install-nats-server.sh
. deploy/install-nats-server.sh

if [[ -n "${JETSCHED_BIN_DIR:-}" ]]; then
    bin="$JETSCHED_BIN_DIR"
else
    echo "building release binaries (first time: a few minutes)..."
    cargo build --release --locked --bins -q
    bin="target/release"
fi

pids=()
stop() {
    trap - INT TERM EXIT
    echo
    echo "stopping..."
    for (( i=${#pids[@]}-1; i>=0; i-- )); do
        kill -TERM "${pids[$i]}" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    echo "stopped."
}
trap stop EXIT
trap 'stop; exit 0' INT TERM

wait_http() { # url what
    for _ in $(seq 1 150); do
        if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
        sleep 0.2
    done
    echo "$2 did not become ready ($1); see $logs/" >&2
    exit 1
}

if curl -fsS -o /dev/null "http://127.0.0.1:8222/healthz?js-enabled-only=true" 2>/dev/null; then
    echo "reusing the nats-server already running on 127.0.0.1:4222"
else
    # nats.conf with the store under $state (the same file when $state is the default).
    sed "s#store_dir: \".jetsched-local/nats\"#store_dir: \"$state/nats\"#" nats.conf >"$state/nats.conf"
    nats-server -c "$state/nats.conf" >>"$logs/nats-server.log" 2>&1 &
    pids+=($!)
    echo $! >>"$state/pids"
    wait_http "http://127.0.0.1:8222/healthz?js-enabled-only=true" "nats-server"
fi

export NATS_URL="nats://127.0.0.1:4222"
export RUST_LOG="${RUST_LOG:-info,async_nats=warn}"
# The allocator returns freed memory at once (README, "Deployment").
export MIMALLOC_PURGE_DELAY="${MIMALLOC_PURGE_DELAY:-0}"

start() { # name log admin-port args...
    local name="$1" log="$2" port="$3"
    shift 3
    "$bin/$name" --admin-addr "127.0.0.1:$port" "$@" >>"$logs/$log.log" 2>&1 &
    pids+=($!)
    echo $! >>"$state/pids"
}

start jetsched-registry registry 9101 --instance-id registry-1
wait_http "http://127.0.0.1:9101/readyz" "jetsched-registry"
start jetsched-scheduler scheduler-1 9102 --instance-id scheduler-1
start jetsched-scheduler scheduler-2 9112 --instance-id scheduler-2
# The demo examples call HTTP servers on 127.0.0.1: loopback is allowed for every namespace
# here only (the http executor refuses internal networks unless --http-allow lists them).
start jetsched-worker worker-1 9103 --instance-id worker-1 --shell-allow echo,date --http-allow '*=127.0.0.0/8'
start jetsched-worker worker-2 9113 --instance-id worker-2 --shell-allow echo,date --http-allow '*=127.0.0.0/8'
start jetsched-alerter alerter 9104 --instance-id alerter-1
start jetsched-console console 9105 --instance-id console-1 --http-addr 127.0.0.1:9180 --allow-actions
for port in 9102 9112 9103 9113 9104 9105; do
    wait_http "http://127.0.0.1:$port/readyz" "service on admin port $port"
done

echo
"$bin/jetsched" apply -f deploy/examples/

cat <<TXT

jetsched is running (logs in $logs/).
Console (tasks, runs, dead letters, live events; actions allowed on loopback):
  http://127.0.0.1:9180/
Try:
  $bin/jetsched ls --namespace demo
  $bin/jetsched next demo/berlin-clock -c 5
  $bin/jetsched events --follow
  $bin/jetsched trigger demo/heartbeat
Metrics and health:
  registry   http://127.0.0.1:9101/metrics   (/healthz, /readyz)
  schedulers http://127.0.0.1:9102/metrics   http://127.0.0.1:9112/metrics
  workers    http://127.0.0.1:9103/metrics   http://127.0.0.1:9113/metrics
  alerter    http://127.0.0.1:9104/metrics   (alerts also go to jetsched.alert.<severity>)
  console    http://127.0.0.1:9105/metrics
NATS monitor:
  http://127.0.0.1:8222/jsz?streams=true&consumers=true
The task demo/always-failing exhausts its retries and lands in the JETSCHED_DLQ stream.
Press Ctrl-C to stop.
TXT

if [[ -n "$run_for" ]]; then
    # In the background and waited for: bash runs the INT/TERM trap at once during `wait`,
    # but only after a foreground `sleep` ends.
    sleep "$run_for" &
    wait $!
else
    # Wake up when a service dies, so a crash is not hidden.
    while true; do
        for pid in "${pids[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "a process ($pid) exited; see $logs/" >&2
                exit 1
            fi
        done
        sleep 1
    done
fi
