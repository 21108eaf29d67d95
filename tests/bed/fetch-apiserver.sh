#!/usr/bin/env bash
# Builds the real Kubernetes `apiextensions-apiserver` (CRDs, CEL validation, status subresource,
# server-side apply, watch) from Debian unstable's Go source packages, and installs etcd 3.4 from
# the machine's own Debian. No kube-apiserver package exists here; this server is the closest real
# API server there is. Nothing touches the machine's apt sources: sid is read through a private apt
# state directory, and the Go module proxy is never used.
# Usage: fetch-apiserver.sh DEST   (DEST/bin/apiextensions-apiserver afterwards)
set -euo pipefail
dest=${1:?destination directory}
bin="$dest/bin/apiextensions-apiserver"

if ! command -v etcd >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends etcd-server
fi

if [ -x "$bin" ]; then
  exit 0
fi

. "$(dirname "$0")/private-apt.sh"
private_apt sid
mkdir -p "$work/debs" "$work/tree"

root_pkg=golang-k8s-apiextensions-apiserver-dev
if ! apt-cache "${apt_opts[@]}" show "$root_pkg" >/dev/null 2>&1; then
  echo "fetch-apiserver: $root_pkg is not in sid at $mirror" >&2
  exit 1
fi
# Source packages the server's import graph needs (every golang-*-dev in the dependency closure).
apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances --no-pre-depends "$root_pkg" \
  | grep -E '^golang-[a-z0-9.+-]+-dev$' | sort -u > "$work/pkgs"
# The Go toolchain of the same suite (the versioned compiler and its standard library source).
go_pkg=$(apt-cache "${apt_opts[@]}" depends golang-go | awk '/Depends: golang-1\.[0-9]+-go/ {print $2; exit}')
if [ -z "$go_pkg" ]; then
  echo "fetch-apiserver: cannot find the versioned Go toolchain behind golang-go in sid" >&2
  exit 1
fi
go_ver=${go_pkg#golang-}; go_ver=${go_ver%-go}
printf '%s\n' "$go_pkg" "golang-$go_ver-src" >> "$work/pkgs"
echo "fetch-apiserver: downloading $(wc -l < "$work/pkgs") packages (Go $go_ver)"
(cd "$work/debs" && xargs apt-get "${apt_opts[@]}" download -qq < "$work/pkgs" >/dev/null)
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/tree"; done

goroot="$work/tree/usr/lib/go-$go_ver"
mkdir -p "$dest/bin"
echo "fetch-apiserver: building k8s.io/apiextensions-apiserver"
(cd "$work" && GOROOT="$goroot" GOPATH="$work/tree/usr/share/gocode" GO111MODULE=off GOPROXY=off \
  GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0 GOCACHE="$work/gocache" \
  "$goroot/bin/go" build -o "$bin.tmp" k8s.io/apiextensions-apiserver)
mv "$bin.tmp" "$bin"
"$bin" --help >/dev/null 2>&1 || true
echo "fetch-apiserver: $bin"
