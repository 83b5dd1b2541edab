#!/usr/bin/env bash
# UCX (Debian's libucx0 1.13 and ucx-utils), unmodified, over peercm through `peercm exec`
# (issue 32 part 6, docs/drop-in.md):
#   info         `ucx_info -d` runs with peercm loaded: UCX's IB modules load over the drop-in
#                libraries, and its rdmacm connection manager opens peercm's event channel.
#                When /dev/infiniband/peercm_roce0 exists (below), the IB memory domain of
#                peercm_roce0 must list rc_verbs and ud_verbs too.
#   perftest_rc  ucx_perftest's UCP tag-matching latency and bandwidth with UCX_TLS=rc
#                (rc_verbs for data, ud_verbs for wireup) over RoCE between two processes.
#                UCX 1.13 lists an IB device only if /dev/infiniband/<device> is a character
#                device it may read and write (the kernel's uverbs node), which a userspace
#                device has not: this case runs only where someone made such a node by hand
#                and is skipped (77) otherwise.
# usage: run_ucx.sh PEERCM_TOOL CASE
set -euo pipefail
peercm=$1 case=$2
# shellcheck source=tests/dropin_mw/lib.sh
source "$(dirname "$0")/lib.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
node=/dev/infiniband/peercm_roce0
have_node() { [[ -c $node && -r $node && -w $node ]]; }

case $case in
  info)
    timeout 60 "$peercm" exec --transport roce -- ucx_info -d > "$out/info" 2>&1 ||
      { cat "$out/info"; echo "FAIL: ucx_info -d exited non-zero"; exit 1; }
    grep -q '^# Connection manager: rdmacm' "$out/info" ||
      { cat "$out/info"; echo "FAIL: no rdmacm connection manager"; exit 1; }
    echo "ucx_info -d: rdmacm connection manager listed"
    if have_node; then
      tr -s ' \n#' ' ' < "$out/info" > "$out/flat"
      grep -Eq 'Memory domain: peercm_roce0 .*Transport: rc_verbs Device: peercm_roce0:1' "$out/flat" ||
        { cat "$out/info"; echo "FAIL: no rc_verbs on peercm_roce0:1"; exit 1; }
      echo "ucx_info -d: rc_verbs and ud_verbs on peercm_roce0:1"
    else
      echo "($node absent: UCX lists no IB device; docs/drop-in.md)"
    fi
    ;;
  perftest_rc)
    have_node || { echo "SKIP: $node is not a character device (docs/drop-in.md)"; exit 77; }
    # UCX's UD reads the RoCE packet type from the completion's sl (mlx5 hardware's code) to
    # check the GRH's destination; peercm's sl is 0, so the check must be off.
    export UCX_TLS=rc UCX_NET_DEVICES=peercm_roce0:1 UCX_UD_VERBS_ETH_DGID_CHECK=n
    for test in tag_lat tag_bw; do
      port=$(free_tcp_port)
      timeout 60 "$peercm" exec --transport roce -- ucx_perftest -t "$test" -s 4096 -n 1000 -p "$port" > "$out/server" 2>&1 &
      server=$!
      for _ in $(seq 50); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.1; done
      client_rc=0 server_rc=0
      timeout 60 "$peercm" exec --transport roce -- ucx_perftest -t "$test" -s 4096 -n 1000 -p "$port" 127.0.0.1 > "$out/client" 2>&1 || client_rc=$?
      wait "$server" || server_rc=$?
      if ((client_rc != 0 || server_rc != 0)) || ! grep -q '^Final: *1000 ' "$out/client"; then
        cat "$out/client" "$out/server"; echo "FAIL: ucx_perftest -t $test: client $client_rc, server $server_rc"; exit 1
      fi
      echo "ucx_perftest -t $test -s 4096, UCX_TLS=rc over RoCE: $(grep '^Final:' "$out/client")"
    done
    ;;
  *) echo "run_ucx.sh: unknown case $case" >&2; exit 2 ;;
esac
echo "PASS: $case"
