#!/bin/bash
# Entry point of the jetsched container image: one image, the command picks the binary.
#
#   docker run IMAGE registry|scheduler|worker|alerter|console [flags]   a service
#   docker run IMAGE jetsched ls                                 the CLI (also: cli ls)
#   docker run IMAGE healthcheck [/readyz]                       probe the local admin port
#   docker run IMAGE <anything else>                             run it as given
#
# A service started without JETSCHED_ADMIN_ADDR listens on 0.0.0.0:<its port> (registry 9101,
# scheduler 9102, worker 9103, alerter 9104, console 9105; the console's pages: set
# JETSCHED_CONSOLE_HTTP_ADDR) instead of the binaries' loopback default, so
# Docker / Kubernetes health checks and Prometheus can reach /healthz, /readyz and /metrics.
# Everything else is configured through the binaries' own flags and variables (`--help`).
set -euo pipefail

bin_dir="${JETSCHED_BIN_DIR:-/usr/local/bin}"

admin_port() {
    case "$1" in
        registry) echo 9101 ;;
        scheduler) echo 9102 ;;
        worker) echo 9103 ;;
        alerter) echo 9104 ;;
        console) echo 9105 ;;
    esac
}

# GETs `path` (default /healthz) from the admin port in JETSCHED_ADMIN_ADDR (or the role given
# by JETSCHED_ROLE); succeeds on HTTP 200. No curl in the image: bash's /dev/tcp does it.
healthcheck() {
    local path="${1:-/healthz}" addr port status
    addr="${JETSCHED_ADMIN_ADDR:-}"
    if [[ -z "$addr" ]]; then
        port="$(admin_port "${JETSCHED_ROLE:-}")"
        [[ -n "$port" ]] || { echo "healthcheck: set JETSCHED_ADMIN_ADDR or JETSCHED_ROLE" >&2; return 2; }
    else
        port="${addr##*:}"
    fi
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$path" >&3
    read -r -t 5 _ status _ <&3 || true
    exec 3<&-
    [[ "$status" == "200" ]] || { echo "healthcheck: $path answered ${status:-nothing}" >&2; return 1; }
}

case "${1:-}" in
    registry | scheduler | worker | alerter | console)
        role="$1"
        shift
        export JETSCHED_ROLE="$role"
        export JETSCHED_ADMIN_ADDR="${JETSCHED_ADMIN_ADDR:-0.0.0.0:$(admin_port "$role")}"
        exec "$bin_dir/jetsched-$role" "$@"
        ;;
    jetsched | cli)
        shift
        exec "$bin_dir/jetsched" "$@"
        ;;
    healthcheck)
        shift
        healthcheck "$@"
        ;;
    "")
        echo "usage: registry|scheduler|worker|alerter|console [flags] | jetsched <command> | healthcheck [path]" >&2
        exit 2
        ;;
    *)
        exec "$@"
        ;;
esac
