#!/usr/bin/env bash
# Checks that the fuzz crate (fuzz/) compiles, so that its targets cannot rot
# unnoticed when the entry points they call (`mpg_gateway::wire`, the parsers)
# change.
#
#   scripts/fuzz-build.sh              cargo check of every target, stable toolchain
#   MPG_FUZZ_BUILD=1 scripts/fuzz-build.sh
#                                      also `cargo +nightly fuzz build` (sanitizer
#                                      build; needs nightly and cargo-fuzz)
#
# `cargo check` needs no nightly and no cargo-fuzz: libfuzzer-sys compiles on
# stable (its build script builds libFuzzer, so a C++ compiler must be present);
# only linking and running a target with the sanitizers needs nightly. The check
# shares the main target directory, so the dependencies `cargo clippy` checked
# before it are reused rather than checked again.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo check --locked --manifest-path fuzz/Cargo.toml --target-dir target --bins

if [ "${MPG_FUZZ_BUILD:-0}" = 1 ]; then
  cd fuzz
  cargo +nightly fuzz build
fi
