#!/usr/bin/env bash
# Installs every Debian 12 package peercm needs to build, test and benchmark.
# Idempotent and non-interactive: only missing packages are installed (scripts/lib/apt.sh).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/apt.sh
source "$(dirname "$0")/lib/apt.sh"

# tshark decodes the tshark_tests' captures; wireshark-common (a dependency of tshark, named
# for its dumpcap) captures loopback traffic for the live RoCE test, which needs root or
# CAP_NET_RAW and skips without.
packages=(
  g++ cmake ninja-build pkg-config git python3
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  libisal-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  tshark wireshark-common iproute2
  libpmix-dev openmpi-bin
  # the drop-in tests (tests/dropin): Debian's own RDMA programs, and rdma-core's headers that
  # the ABI layout test compiles against
  rdmacm-utils ibverbs-utils perftest libibverbs-dev librdmacm-dev
  # Middleware run unmodified over the drop-in libibverbs/librdmacm (tests/dropin_mw):
  # fi_info/fi_pingpong, ucx_info/ucx_perftest, and mpicc for the project's MPI program.
  libfabric-bin ucx-utils libopenmpi-dev
)

apt_ensure --tag setup "${packages[@]}"
