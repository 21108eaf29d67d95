#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests need, then
# `cargo test`. Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> wasm32-wasip2 target (the policies are built for it)"
rustup target add wasm32-wasip2

echo "==> test bed: a real OCI registry, containerd 1.7 and runc; musl-gcc for the static image"
if ! command -v docker-registry >/dev/null || ! command -v runc >/dev/null || ! command -v musl-gcc >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker-registry runc musl-tools
fi
if ! command -v kubectl >/dev/null; then
  echo "kubectl is missing: tests/deploy_manifests.rs renders deploy/ with kubectl kustomize" >&2
  exit 1
fi
bash tests/bed/fetch-containerd.sh /opt/pinset-bed/containerd

echo "==> test bed: wasm-pkg-tools' wkg (policy artifacts interoperate with it; tests/policy_artifacts.rs)"
if [ ! -x /opt/pinset-bed/wkg/bin/wkg ]; then
  # A debug build: 3 min instead of 7 for a tool the tests run a few times.
  cargo install wkg --locked --version 0.16.1 --debug --root /opt/pinset-bed/wkg
fi

echo "==> test bed: etcd and the real apiextensions-apiserver (built from Debian sources)"
bash tests/bed/fetch-apiserver.sh /opt/pinset-bed/apiserver

echo "==> cargo clippy --workspace --all-targets -D warnings (lints, and the crates' layering compiles)"
rustup component add clippy
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> the container image (scripts/image.sh; the image tests run it under containerd)"
bash scripts/image.sh

echo "==> cargo test --workspace --no-fail-fast (one failing test binary does not hide the others)"
cargo test --workspace --locked --no-fail-fast
