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
. "$(dirname "$0")/private-apt.sh"
private_apt trixie
(cd "$work" && apt-get "${apt_opts[@]}" download "containerd=$want*" >/dev/null) || {
  echo "fetch-containerd: containerd $want is not in trixie at $mirror" >&2
  exit 1
}
mkdir -p "$dest"
dpkg -x "$work"/containerd_*.deb "$dest"
"$dest/usr/bin/containerd" --version
