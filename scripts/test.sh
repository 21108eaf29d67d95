#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests need, then
# `cargo test`. Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> wasm32-wasip2 target (the policies are built for it)"
rustup target add wasm32-wasip2

echo "==> test bed packages (a real OCI registry)"
if ! command -v docker-registry >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker-registry
fi

echo "==> cargo test --workspace"
cargo test --workspace --locked
