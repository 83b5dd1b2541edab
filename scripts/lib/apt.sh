#!/usr/bin/env bash
# Idempotent, non-interactive installer of Debian packages, shared by the scripts.
#   source scripts/lib/apt.sh; apt_ensure [--tag NAME] PACKAGE...
# Installs only the packages that are missing (as root, or through sudo) and runs
# `apt-get update` at most once per call, only when something is missing.

apt_missing() {  # prints the packages of "$@" that are not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || printf '%s\n' "$p"
  done
}

apt_ensure() {
  local tag=setup
  if [[ ${1-} == --tag ]]; then tag=$2; shift 2; fi
  local missing=()
  mapfile -t missing < <(apt_missing "$@")
  if ((${#missing[@]} == 0)); then
    echo "${tag}: all packages present"
    return 0
  fi
  echo "${tag}: installing ${missing[*]}"
  local sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  # tshark asks whether non-root users may capture; answer once, quietly.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | "${sudo_cmd[@]}" debconf-set-selections
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}
