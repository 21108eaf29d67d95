#!/usr/bin/env bash
# Policy hook latency: the embedded default Wasm policy against the native reference policy on
# the same synthetic inputs, for 10, 500 and 5000 images, each run repeated; each run also
# measures the fleet hook at 300 and 3000 nodes. Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${REPEATS:-3}
cargo build --release --locked -p pinset
for n in 10 500 5000; do
  for r in $(seq 1 "$repeats"); do
    echo "== images=$n run=$r"
    ./target/release/pinset policy bench --images "$n" --iterations 300 "$@" | sed -n '/^hook/,$p'
  done
done
