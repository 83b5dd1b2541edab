#!/usr/bin/env bash
# libfabric (Debian's libfabric1 1.17 and fabtests' fi_info/fi_pingpong from libfabric-bin),
# unmodified, over peercm through `peercm exec` (issue 32 part 4, docs/drop-in.md):
#   fi_info          `fi_info -p verbs` lists peercm_iw0 (FI_EP_MSG, and verbs;ofi_rxm RDM)
#                    over iWARP, and peercm_roce0 (MSG and the UD-based DGRAM) over RoCE
#   pingpong_msg     fi_pingpong -p verbs -e msg between two processes over iWARP, every
#                    size from 0 B to 6 MiB, data checked (-c), on domain peercm_iw0 (-d)
#   pingpong_rdm     the same with -p "verbs;ofi_rxm" -e rdm
#   pingpong_msg_roce  fi_pingpong -p verbs -e msg over RoCE, on peercm_roce0: the two
#                    processes share the interface address the provider binds
# usage: run_libfabric.sh PEERCM_TOOL CASE
set -euo pipefail
peercm=$1 case=$2
# shellcheck source=tests/dropin_mw/lib.sh
source "$(dirname "$0")/lib.sh"
need_ipv4_interface
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

expect() {  # expect FILE REGEX WHAT
  if ! grep -Eq "$2" "$1"; then
    echo "FAIL: $3"; cat "$1"; exit 1
  fi
}

# A server and a client of fi_pingpong, both under peercm exec; both must exit 0.
pingpong_pair() {  # pingpong_pair TRANSPORT FI_PINGPONG_ARGS...
  local transport=$1; shift
  local port; port=$(free_tcp_port)
  timeout 60 "$peercm" exec --transport "$transport" -- fi_pingpong "$@" -B "$port" > "$out/server" 2>&1 &
  local server=$!
  local client_rc=0 server_rc=0
  for _ in 1 2 3 4 5 6 7 8 9 10; do  # the server's control socket: up within a second
    ss -ltn "sport = :$port" | grep -q LISTEN && break
    sleep 0.1
  done
  timeout 60 "$peercm" exec --transport "$transport" -- fi_pingpong "$@" -P "$port" 127.0.0.1 > "$out/client" 2>&1 || client_rc=$?
  wait "$server" || server_rc=$?
  if ((client_rc != 0 || server_rc != 0)); then
    echo "FAIL: fi_pingpong $* over $transport: client exit $client_rc, server exit $server_rc"
    cat "$out/client" "$out/server"; exit 1
  fi
  # One row per size, every one acknowledged in full: "<bytes> <sent> =<acked> ...".
  local rows; rows=$(awk '$3 ~ /^=/ && "=" $2 == $3' "$out/client" | wc -l)
  echo "fi_pingpong $* over $transport: $rows sizes, all acknowledged; largest row:"
  tail -n 1 "$out/client"
  [[ $rows -ge 1 ]]
}

case $case in
  fi_info)
    timeout 30 "$peercm" exec --transport iwarp -- fi_info -p verbs > "$out/iwarp" 2>&1
    expect "$out/iwarp" 'domain: peercm_iw0' "fi_info -p verbs over iWARP lists no peercm_iw0"
    tr -s ' \n' ' ' < "$out/iwarp" > "$out/iwarp.flat"
    expect "$out/iwarp.flat" 'provider: verbs fabric: Ethernet-iWARP domain: peercm_iw0 version: [0-9.]+ type: FI_EP_MSG protocol: FI_PROTO_IWARP' \
      "no FI_EP_MSG on peercm_iw0"
    expect "$out/iwarp.flat" 'provider: verbs;ofi_rxm fabric: Ethernet-iWARP domain: peercm_iw0 version: [0-9.]+ type: FI_EP_RDM' \
      "no verbs;ofi_rxm FI_EP_RDM on peercm_iw0"
    timeout 30 "$peercm" exec --transport roce -- fi_info -p verbs > "$out/roce" 2>&1
    tr -s ' \n' ' ' < "$out/roce" > "$out/roce.flat"
    expect "$out/roce.flat" 'domain: peercm_roce0 version: [0-9.]+ type: FI_EP_MSG protocol: FI_PROTO_RDMA_CM_IB_RC' \
      "no FI_EP_MSG on peercm_roce0"
    expect "$out/roce.flat" 'domain: peercm_roce0-dgram version: [0-9.]+ type: FI_EP_DGRAM protocol: FI_PROTO_IB_UD' \
      "no FI_EP_DGRAM on peercm_roce0"
    echo "fi_info -p verbs: $(grep -c '^provider:' "$out/iwarp") entries over iWARP, $(grep -c '^provider:' "$out/roce") over RoCE"
    grep -E 'domain:' "$out/iwarp" "$out/roce" | sort | uniq -c
    ;;
  pingpong_msg) pingpong_pair iwarp -p verbs -e msg -d peercm_iw0 -S all -I 5 -c ;;
  pingpong_rdm) pingpong_pair iwarp -p "verbs;ofi_rxm" -e rdm -d peercm_iw0 -S all -I 5 -c ;;
  pingpong_msg_roce) pingpong_pair roce -p verbs -e msg -d peercm_roce0 -S all -I 5 -c ;;
  *) echo "run_libfabric.sh: unknown case $case" >&2; exit 2 ;;
esac
echo "PASS: $case"
