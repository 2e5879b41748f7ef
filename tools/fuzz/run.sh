#!/usr/bin/env bash
# Runs every cargo-fuzz target, seeded with tools/fuzz/seeds/. Installs cargo-fuzz if missing.
# The stable toolchain is used with RUSTC_BOOTSTRAP=1 (cargo-fuzz passes -Z flags) and without
# a sanitizer: the code under test is safe Rust, so the fuzzer hunts panics, overflows and
# broken invariants.
#   bash tools/fuzz/run.sh                 # CI: a fixed seed and a fixed number of runs per
#                                          # target (deterministic: same code, same verdict)
#   bash tools/fuzz/run.sh --seconds 600   # exploration: random seed, time-bounded
# A crash leaves its input in tools/fuzz/artifacts/<target>/; make it a regression test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bound=(-seed=1 -runs=1500000)
if [[ "${1:-}" == "--seconds" ]]; then
    bound=(-max_total_time="${2:?--seconds needs a number}")
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --version 0.13.2
export RUSTC_BOOTSTRAP=1
cargo fuzz build --fuzz-dir tools/fuzz -s none -O
for target in spec schedule registry_request; do
    corpus="tools/fuzz/corpus/$target"
    mkdir -p "$corpus"
    seeds=()
    [[ -d "tools/fuzz/seeds/$target" ]] && seeds+=("tools/fuzz/seeds/$target")
    echo "fuzzing $target (${bound[*]})"
    cargo fuzz run --fuzz-dir tools/fuzz -s none -O "$target" "$corpus" "${seeds[@]}" -- \
        "${bound[@]}" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | grep -E "^(Done|stat::number_of_executed_units|==|.*panicked)" || true
    if compgen -G "tools/fuzz/artifacts/$target/crash-*" >/dev/null; then
        echo "fuzz target $target crashed; inputs in tools/fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
