#!/usr/bin/env bash
# Fetches containerd 1.7 (Debian trixie) into a private directory, without changing the
# machine's apt sources: Debian 12's containerd 1.6 never reports images as pinned.
# Usage: fetch-containerd.sh DEST   (DEST/usr/bin/containerd afterwards)
set -euo pipefail
dest=${1:?destination directory}
want=${CONTAINERD_VERSION:-1.7.24}
if [ -x "$dest/usr/bin/containerd" ] && "$dest/usr/bin/containerd" --version | grep -q "$want"; then
  exit 0
fi
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [ -z "$mirror" ]; then
  mirror=$(awk '/^deb / && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "Debug::NoLocking=1"
          -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" update -qq
(cd "$work" && apt-get "${apt_opts[@]}" download "containerd=$want*" >/dev/null) || {
  echo "fetch-containerd: containerd $want is not in trixie at $mirror" >&2
  exit 1
}
mkdir -p "$dest"
dpkg -x "$work"/containerd_*.deb "$dest"
"$dest/usr/bin/containerd" --version
