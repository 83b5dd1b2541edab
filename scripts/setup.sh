#!/usr/bin/env bash
# Installs every Debian 12 package peercm needs to build, test and benchmark.
# Idempotent and non-interactive: only missing packages are installed.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config git python3
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  libisal-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  tshark iproute2
  libpmix-dev openmpi-bin
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer once, quietly.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | "${sudo_cmd[@]}" debconf-set-selections
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
