#!/usr/bin/env bash
# Installs the test bed: three Debian packages (a real OCI registry, runc, etcd), and into
# /opt/pinset-bed containerd 1.7, the real apiextensions-apiserver (built from Debian's Go
# sources) and wasm-pkg-tools' wkg. scripts/test.sh runs it in the background while the code
# compiles; what is already installed is kept. Output: one line per step, each tool's own output
# prefixed with its name.
set -euo pipefail
cd "$(dirname "$0")/../.."
bed=${PINSET_BED_DIR:-/opt/pinset-bed}
step() { printf '==> [bed %4ds] %s\n' "$SECONDS" "$*"; }
# Run "$@" with its output prefixed by NAME.
tagged() {
  local name=$1
  shift
  "$@" 2>&1 | sed -u "s/^/[$name] /"
  return "${PIPESTATUS[0]}"
}

missing=()
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v runc >/dev/null || missing+=(runc)
command -v etcd >/dev/null || missing+=(etcd-server)
if [ ${#missing[@]} -gt 0 ]; then
  step "Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  tagged apt apt-get update -qq
  tagged apt apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v kubectl >/dev/null; then
  echo "kubectl is missing: tests/it/deploy_manifests.rs renders deploy/ with kubectl kustomize" >&2
  exit 1
fi

# The rest fetch into private directories (no shared apt state): all at once.
step "containerd 1.7, the API server, wkg 0.16.1 (at once)"
tagged containerd bash tests/bed/fetch-containerd.sh "$bed/containerd" &
containerd=$!
tagged apiserver bash tests/bed/fetch-apiserver.sh "$bed/apiserver" &
apiserver=$!
if [ ! -x "$bed/wkg/bin/wkg" ]; then
  # A debug build: half the time of a release build, for a tool the tests run a few times.
  tagged wkg cargo install wkg --locked --version 0.16.1 --debug --root "$bed/wkg" --quiet &
else
  true &
fi
wkg=$!
failed=()
wait "$containerd" || failed+=(containerd)
wait "$apiserver" || failed+=(apiserver)
wait "$wkg" || failed+=(wkg)
if [ ${#failed[@]} -gt 0 ]; then
  echo "test bed: could not install: ${failed[*]} (see the lines tagged with those names)" >&2
  exit 1
fi
step "installed"
