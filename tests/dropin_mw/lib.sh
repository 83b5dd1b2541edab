# shellcheck shell=bash
# Shared by the tests/dropin_mw scripts (sourced). Every program runs under `timeout`.
#   need_ipv4_interface   exits 77 (ctest: skipped) when the host has no non-loopback IPv4
#                         interface that is up: libfabric's verbs provider offers FI_EP_MSG
#                         (and so ofi_rxm and Open MPI's ofi MTL) only on such interfaces.
#   free_tcp_port         prints a TCP port nothing listens on now.
need_ipv4_interface() {
  if ! ip -4 -o addr show up | awk '$2 != "lo"' | grep -q inet; then
    echo "SKIP: no IPv4 interface besides lo is up (libfabric's verbs provider skips loopback interfaces)"
    exit 77
  fi
}

free_tcp_port() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/free_port.py"
}
