#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/) for a bounded time each, starting from the
# committed corpus (fuzz/corpus/<target>/), and fails on an input that panics.
#
#   scripts/fuzz.sh                   every target, MPG_FUZZ_SECONDS (60) each
#   scripts/fuzz.sh query jwks        those targets only
#
# 1. The stable driver (fuzz/src/bin/replay.rs) replays every committed input,
#    on any toolchain: a crash that was fixed and its input committed under
#    fuzz/corpus/<target>/ is a regression test from then on.
# 2. Then each target runs for MPG_FUZZ_SECONDS, two at a time (one a core):
#    with libFuzzer (coverage-guided) where a nightly toolchain is installed,
#    cargo-fuzz being installed for it if missing; otherwise with the stable
#    driver's seeded mutations. Inputs libFuzzer adds go to a scratch folder,
#    never into the committed corpus. A crash is written to
#    fuzz/artifacts/<target>/ and fails the run; commit it to the corpus with
#    the fix.
#
# libFuzzer builds with no sanitizer: the gateway forbids unsafe code, so what
# the targets look for is a panic or a failed assertion, which needs none, and
# AddressSanitizer would halve the executions a run gets.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${MPG_FUZZ_SECONDS:-60}"
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -vx 'mpg-gateway-fuzz\|replay')
fi
logs=target/fuzz-logs
mkdir -p "$logs"

# A debug build in the gateway's own target directory, whose dependencies
# the test build has already compiled.
cargo build --quiet --locked --manifest-path fuzz/Cargo.toml --target-dir target \
  --no-default-features --features stable --bin replay
replay=target/debug/replay
"$replay" --seconds 0 "${targets[@]}"

if cargo +nightly --version >/dev/null 2>&1; then
  command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
  (cd fuzz && cargo +nightly fuzz build --sanitizer none --codegen-units 16)
  bin=fuzz/target/x86_64-unknown-linux-gnu/release
  run_one() {
    local t=$1 scratch
    scratch=$(mktemp -d)
    mkdir -p "fuzz/artifacts/$t"
    if "$bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" "$scratch" "fuzz/corpus/$t" >"$logs/$t.log" 2>&1; then
      echo "$t: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$') runs in ${seconds}s, no crash"
    else
      echo "$t: FAILED; the end of its log ($logs/$t.log):"
      tail -n 40 "$logs/$t.log"
      rm -rf "$scratch"
      return 1
    fi
    rm -rf "$scratch"
  }
  export -f run_one
  export bin seconds logs
  printf '%s\n' "${targets[@]}" | xargs -P 2 -I{} bash -c 'run_one {}'
else
  echo "no nightly toolchain: the stable driver fuzzes instead of libFuzzer"
  printf '%s\n' "${targets[@]}" | xargs -P 2 -I{} "$replay" --seconds "$seconds" {}
fi
