#!/usr/bin/env bash
# Builds rdma-core's rping, rdma_server and rdma_client (sources kept outside the repository)
# unmodified against peercm's headers and library, and runs them over loopback:
#   rping -v -V -C 100 (Send, RDMA Read, RDMA Write; data validated), the same with -q (a QP
#   made with ibv_create_qp: CONNECT_RESPONSE, rdma_init_qp_attr, rdma_establish), both again
#   over RoCEv2 (PEERCM_TRANSPORT=roce), and rdma_server with rdma_client (the
#   synchronous API; a server listening on INADDR_ANY) over both transports.
# usage: run_rdma_core_examples.sh REF_DIR INCLUDE_DIR LIB_DIR OUT_DIR [SANITIZERS]
set -euo pipefail
ref=$1 include=$2 lib=$3 out=$4 sanitize=${5:-}
mkdir -p "$out"
flags=(-O1 -I"$include" -L"$lib" -Wl,-rpath,"$lib" -lpeercm-rdma -lpthread)
[[ -n $sanitize ]] && flags+=(-fsanitize="$sanitize")
if [[ $sanitize == *thread* ]]; then
  # rping's CQ thread writes its connection state unsynchronised with its main thread: a
  # race in the example itself, not in peercm, which TSan still checks everywhere else.
  printf 'race:cq_thread\n' > "$out/tsan.supp"
  export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}suppressions=$out/tsan.supp"
fi
cc -o "$out/rping" "$ref/examples/rping.c" "$ref/examples/common.c" "${flags[@]}"
cc -o "$out/rdma_server" "$ref/examples/rdma_server.c" "${flags[@]}"
cc -o "$out/rdma_client" "$ref/examples/rdma_client.c" "${flags[@]}"

free_port() { python3 "$(dirname "$0")/../../scripts/lib/free_port.py"; }

rping_pair() {
  local port; port=$(free_port)
  local address=${RPING_ADDRESS:-127.0.0.1}
  timeout 60 "$out/rping" -s -a "$address" -p "$port" "$@" > "$out/server.out" 2> "$out/server.err" &
  local server=$!
  sleep 0.5
  timeout 60 "$out/rping" -c -a "$address" -p "$port" "$@" > "$out/client.out" 2> "$out/client.err"
  wait "$server"
  local pings; pings=$(grep -c '^ping data: rdma-ping-' "$out/client.out")
  echo "rping $* ${PEERCM_TRANSPORT:-iwarp}: client and server exit 0, client printed $pings verified pings"
  [[ $pings -eq 100 ]]
  ! grep -q "data mismatch" "$out/client.err"
}
rping_pair -v -V -C 100
rping_pair -q -v -V -C 100
# Over RoCEv2: a RoCE node is one address, so the server takes a random 127/8 one.
for args in "-v -V -C 100" "-q -v -V -C 100"; do
  # shellcheck disable=SC2086
  PEERCM_TRANSPORT=roce RPING_ADDRESS=127.$((RANDOM % 250 + 1)).$((RANDOM % 250)).$((RANDOM % 250 + 1)) \
    rping_pair $args
done

# rdma_server listens on INADDR_ANY; over RoCE that opens a node on each interface address.
rdma_server_pair() {
  local port; port=$(free_port)
  timeout 60 "$out/rdma_server" -p "$port" > "$out/rdma_server.out" &
  local server=$!
  sleep 0.5
  timeout 60 "$out/rdma_client" -s 127.0.0.1 -p "$port" | tee "$out/rdma_client.out"
  wait "$server"
  cat "$out/rdma_server.out"
  grep -q "rdma_client: end 0" "$out/rdma_client.out"
  grep -q "rdma_server: end 0" "$out/rdma_server.out"
  echo "rdma_server/rdma_client ${PEERCM_TRANSPORT:-iwarp}: both ended 0"
}
rdma_server_pair
PEERCM_TRANSPORT=roce rdma_server_pair

# Struct layouts and constants against rdma-core's own headers, when those are there too.
if [[ -f $ref/layout/check.c && -d $ref/sys/usr/include ]]; then
  cc -I"$include" "$ref/layout/check.c" -o "$out/layout-peercm"
  cc -I"$ref/sys/usr/include" "$ref/layout/check.c" -o "$out/layout-rdma-core"
  diff <("$out/layout-peercm") <("$out/layout-rdma-core")
  echo "layouts: $(grep -c . <("$out/layout-peercm")) sizes, offsets and constants identical"
fi
