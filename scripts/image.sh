#!/usr/bin/env bash
# Builds pinset's container image without a container engine: the release binary — the one
# `cargo build --release -p pinset` (the README's first command) and the test suite build — with
# the C runtime it links (glibc's loader, libc, libm and libgcc_s, copied from this machine with
# their copyright files, as distroless' "cc" images carry them) and the CA certificates, in one
# layer on an empty base — the image the Containerfile describes — written as an OCI image layout
# in a tar archive, which `ctr images import`, `podman load`, `docker load` and `kind load
# image-archive` read.
#
#   bash scripts/image.sh            # writes target/image/pinset.tar, prints the image reference
#
# PINSET_BINARY names a release binary already built (scripts/test.sh passes the one its test
# build made, so the image holds exactly the binary the tests ran); without it the script runs
# `cargo build --release -p pinset`, which does nothing when that build is current.
# PINSET_IMAGE (default localhost/pinset:VERSION) names the image; the manifests in deploy/ name
# localhost/pinset:VERSION, so a kustomization's `images:` points them at a pushed copy.
# Version and source commit are OCI annotations of the manifest and labels of the image config.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
ref=${PINSET_IMAGE:-localhost/pinset:$version}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
out=target/image
certs=/etc/ssl/certs/ca-certificates.crt

[ -r "$certs" ] || { echo "image.sh: $certs is missing (Debian: apt-get install ca-certificates)" >&2; exit 1; }
binary=${PINSET_BINARY:-}
if [ -z "$binary" ]; then
  echo "==> release binary (cargo build --release -p pinset)" >&2
  cargo build --locked --release -p pinset >&2
  binary=target/release/pinset
fi
[ -x "$binary" ] || { echo "image.sh: $binary is not an executable" >&2; exit 1; }
interp=$(readelf -l "$binary" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
[ -n "$interp" ] || { echo "image.sh: $binary names no program interpreter" >&2; exit 1; }
if ldd "$binary" | grep -q 'not found'; then
  echo "image.sh: $binary: $(ldd "$binary" | grep 'not found')" >&2
  exit 1
fi
# The shared objects the binary links, as the loader resolves them here.
mapfile -t libs < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')

echo "==> OCI image layout" >&2
rm -rf "$out/rootfs" "$out/layout"
mkdir -p "$out/rootfs/etc/ssl/certs" "$out/rootfs/tmp" "$out/layout/blobs/sha256"
install -m 0755 "$binary" "$out/rootfs/pinset"
runtime=""
for lib in "$interp" "${libs[@]}"; do
  install -D -m 0755 "$(readlink -f "$lib")" "$out/rootfs$lib"
  pkg=$({ dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true; } | head -1 | cut -d: -f1)
  if [ -n "$pkg" ] && [ -r "/usr/share/doc/$pkg/copyright" ]; then
    install -D -m 0644 "/usr/share/doc/$pkg/copyright" "$out/rootfs/usr/share/doc/$pkg/copyright"
    runtime="$runtime $pkg $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true),"
  fi
done
runtime=${runtime%,}
install -m 0644 "$certs" "$out/rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/:/pinset\nnonroot:x:65532:65532:nonroot:/:/pinset\n' > "$out/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$out/rootfs/etc/group"
chmod 0644 "$out/rootfs/etc/passwd" "$out/rootfs/etc/group"
chmod 1777 "$out/rootfs/tmp"

# Reproducible tar: sorted names, numeric root owner, every time the commit's.
det_tar() {
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=posix \
      --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"
}
blob() { # FILE -> moves it into blobs/, prints "digest size"
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  mv "$1" "$out/layout/blobs/sha256/$d"
  echo "$d $s"
}

det_tar -C "$out/rootfs" -cf "$out/layer.tar" .
diff_id=$(sha256sum "$out/layer.tar" | cut -d' ' -f1)
gzip -n -9 -f "$out/layer.tar"
read -r layer layer_size < <(blob "$out/layer.tar.gz")

labels=$(printf '"org.opencontainers.image.title":"pinset","org.opencontainers.image.description":"Pre-pull and pin container images on Kubernetes nodes","org.opencontainers.image.licenses":"Apache-2.0","org.opencontainers.image.version":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.created":"%s"' "$version" "$commit" "$created")
printf '{"created":"%s","architecture":"amd64","os":"linux","config":{"User":"65532:65532","Entrypoint":["/pinset"],"Cmd":["--help"],"Env":["SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"WorkingDir":"/","Labels":{%s}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"scripts/image.sh: /pinset (release), its C runtime (%s) and CA certificates"}]}' \
  "$created" "$labels" "$diff_id" "$created" "${runtime# }" > "$out/config.json"
read -r config config_size < <(blob "$out/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":{%s}}' \
  "$config" "$config_size" "$layer" "$layer_size" "$labels" > "$out/manifest.json"
read -r manifest manifest_size < <(blob "$out/manifest.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest" "$manifest_size" "$ref" "$ref" > "$out/layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$out/layout/oci-layout"
# docker load (before Docker 25) reads manifest.json instead of index.json.
printf '[{"Config":"blobs/sha256/%s","RepoTags":["%s"],"Layers":["blobs/sha256/%s"]}]' \
  "$config" "$ref" "$layer" > "$out/layout/manifest.json"
det_tar -C "$out/layout" -cf "$out/pinset.tar" .
rm -rf "$out/rootfs" "$out/layout"

echo "wrote $out/pinset.tar ($(stat -c %s "$out/pinset.tar") bytes; layer $layer_size bytes compressed; manifest sha256:$manifest)" >&2
echo "$ref"
