#!/usr/bin/env bash
# Policy hook latency: the embedded default Wasm policy against the native reference policy on
# the same synthetic inputs, for 10, 500 and 5000 images, each run repeated; each run also
# measures a fresh instance and a reconcile against the floor module (a module that decides
# nothing: what the sandbox costs by itself) and the fleet hook at 300 and 3000 nodes. Release
# build.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${REPEATS:-3}
cargo build --release --locked -p pinset
# The floor module, built as the test bed builds every policy (its own target directory).
floor_target=target/wasm-policies
cargo build --release --locked --target wasm32-wasip2 -p pinset-test-policy-floor \
  --manifest-path tests/policies/Cargo.toml --target-dir "$floor_target"
floor=$floor_target/wasm32-wasip2/release/pinset_test_policy_floor.wasm
for n in 10 500 5000; do
  for r in $(seq 1 "$repeats"); do
    echo "== images=$n run=$r"
    ./target/release/pinset policy bench --images "$n" --iterations 300 --floor "$floor" "$@" \
      | sed -n '/^hook/,$p'
  done
done
