#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 30 s each), seeded with the specs in
# tools/fuzz/seeds/. Installs cargo-fuzz if missing. The stable toolchain is used with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz passes -Z flags) and without a sanitizer: the code under test is
# safe Rust, so what the fuzzer hunts is panics, overflows and broken invariants.
#   bash tools/fuzz/run.sh [seconds-per-target]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
seconds="${1:-30}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --version 0.13.2
export RUSTC_BOOTSTRAP=1
cargo fuzz build --fuzz-dir tools/fuzz -s none -O
for target in spec schedule registry_request; do
    corpus="tools/fuzz/corpus/$target"
    mkdir -p "$corpus"
    seeds=()
    [[ -d "tools/fuzz/seeds/$target" ]] && seeds+=("tools/fuzz/seeds/$target")
    echo "fuzzing $target for ${seconds}s"
    cargo fuzz run --fuzz-dir tools/fuzz -s none -O "$target" "$corpus" "${seeds[@]}" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | grep -E "^(Done|stat::number_of_executed_units|==|.*panicked)" || true
    # libFuzzer leaves crash-* files in artifacts/ and exits non-zero on a crash.
    if compgen -G "tools/fuzz/artifacts/$target/crash-*" >/dev/null; then
        echo "fuzz target $target crashed; inputs in tools/fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
