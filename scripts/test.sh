#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine; used by the README and by .ci/run.
#
# The test bed (tests/bed/install.sh: registry, runc, etcd, containerd 1.7, the API server, wkg)
# installs in the background while the code is linted, the generated code checked, and built. The code compiles once, in the release
# profile: the tests, every policy for Wasm, and the `pinset` binary — the one the README's first
# command builds, the one the tests run, the one the container image holds. Then every test runs,
# and every test is mandatory: one that cannot start its bed fails, naming what did not start.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PINSET_SKIP_BED:-}" ] && [ "$PINSET_SKIP_BED" != 0 ]; then
  echo "scripts/test.sh runs every test, the bed's included: unset PINSET_SKIP_BED" >&2
  exit 2
fi
step() { printf '==> [%4ds] %s\n' "$SECONDS" "$*"; }

mkdir -p target
step "test bed, in the background (log: target/bed-install.log)"
bash tests/bed/install.sh > target/bed-install.log 2>&1 &
bed=$!

step "toolchain: the wasm32-wasip2 target (policies), clippy"
rustup target add wasm32-wasip2
rustup component add clippy

step "cargo clippy --workspace --all-targets -D warnings (lints, and the crates' layering compiles)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc --workspace --document-private-items -D warnings (every doc link resolves)"
# Private items too: the crates are read by the people who change them. A link from a public
# item's doc to a private one is then a working link.
RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links" \
  cargo doc --workspace --no-deps --document-private-items --locked

step "the checked-in generated code is what proto/ gives (scripts/codegen --check)"
cargo run --quiet --locked --manifest-path scripts/codegen/Cargo.toml -- --check

step "cargo test --release --no-run (one build: the pinset binary, the tests, every policy)"
cargo test --workspace --release --locked --no-run

step "waiting for the test bed"
if ! wait "$bed"; then
  cat target/bed-install.log >&2
  echo "scripts/test.sh: the test bed did not install (above)" >&2
  exit 1
fi
grep '^==> ' target/bed-install.log

step "the container image, from the binary the tests run (scripts/image.sh)"
PINSET_BINARY=target/release/pinset bash scripts/image.sh

# Most tests wait on processes (registries, containerd, API servers, agents): four at a time keep
# two cores busy (BENCHMARKS.md, "Build and CI time").
step "cargo test --release --no-fail-fast (one failing test binary does not hide the others)"
status=0
cargo test --workspace --release --locked --no-fail-fast -- --test-threads 4 || status=$?
# The tests of timing (marked #[ignore] so that no other test's load is theirs): alone.
step "cargo test --release -- --ignored --test-threads 1 (the timing tests, alone)"
cargo test --release --locked -p pinset --test it -- --ignored --test-threads 1 || status=$?
if [ "$status" != 0 ]; then
  echo "scripts/test.sh: tests failed (above)" >&2
  exit "$status"
fi
step "done"
