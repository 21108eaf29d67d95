# Sourced by the fetch scripts: apt reading one Debian suite (`private_apt SUITE`) through a
# private state directory, never the machine's apt sources. Sets `work` (a temporary directory,
# removed on exit), `mirror` (the machine's Debian mirror, else deb.debian.org) and `apt_opts`
# (the options that point apt-get and apt-cache at that state), and reads the suite's lists.
private_apt() {
  local suite=${1:?suite}
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [ -z "$mirror" ]; then
    mirror=$(awk '/^deb / && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  fi
  mirror=${mirror:-http://deb.debian.org/debian}
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" > "$work/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
            -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "Debug::NoLocking=1"
            -o "APT::Sandbox::User=root" -o "Dir::State::Status=/dev/null")
  apt-get "${apt_opts[@]}" update -qq
}
