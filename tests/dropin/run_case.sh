#!/usr/bin/env bash
# One drop-in case: Debian's own binaries (rdmacm-utils, ibverbs-utils, perftest), unmodified,
# run through `peercm exec` on loopback, with their output checked.
#   usage: run_case.sh PEERCM_TOOL CASE [HEAD_START_PRELOAD]
# CASE is PROGRAM_TRANSPORT (rping_iwarp, ib_write_bw_noR_roce, ...; tests/dropin/CMakeLists.txt
# lists them). Every process runs under `timeout`; the whole case ends within about a minute.
# Exit 0 when every check held; otherwise the failed check is printed with the logs' tails.
set -uo pipefail
tool=$1 case=$2 head_start=${3:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/peercm-dropin.XXXXXX")
server_pid=
# A server still running when the case ends (it failed, or serves until stopped) is stopped:
# TERM to the `timeout` that runs it, which passes it on; KILL to both if they linger.
stop_server() {
  [[ -n $server_pid ]] && kill -0 "$server_pid" 2> /dev/null || return 0
  kill -TERM "$server_pid" 2> /dev/null
  local i
  for ((i = 0; i < 20; i++)); do
    kill -0 "$server_pid" 2> /dev/null || break
    sleep 0.1
  done
  if kill -0 "$server_pid" 2> /dev/null; then
    pkill -KILL -P "$server_pid"
    kill -KILL "$server_pid" 2> /dev/null
  fi
  wait "$server_pid" 2> /dev/null
}
trap 'stop_server; rm -rf "$work"' EXIT

transport=${case##*_}
program=${case%_*}
[[ $transport == iwarp || $transport == roce ]] || { echo "bad case $case" >&2; exit 2; }
run() { "$tool" exec --transport "$transport" -- "$@"; }

fail() {
  echo "FAIL $case: $*"
  local f
  for f in "$work"/*.out "$work"/*.err; do
    [[ -s $f ]] && { echo "--- ${f##*/}"; tail -n 15 "$f"; }
  done
  exit 1
}

free_port() { python3 "$(dirname "$0")/../../scripts/lib/free_port.py"; }
# RoCE: each run on a random 127/8 address of its own, so that its UDP 4791 is no other test's.
random_address() { echo "127.$((RANDOM % 250 + 1)).$((RANDOM % 250)).$((RANDOM % 250 + 1))"; }
address=127.0.0.1
[[ $transport == roce ]] && address=$(random_address)

# Waits (at most 5 s) for a TCP listener on $1, or (at most 10 s) for a RoCE CM listener on
# port $1: it holds the unix name @peercm-roce/<uid>/<address>/port/<port> from rdma_listen on
# (docs/roce-transport.md, "Several processes on one address"; an explicit bind may take it a
# moment before the listen, hence the extra 0.1 s). Without a port (udaddy: a UDP port-space
# listener, which holds no name), a 1 s pause.
wait_listener() {
  local i
  [[ -n $1 ]] || { sleep 1; return 0; }
  if [[ $transport == roce && ${2:-cm} == cm ]]; then
    for ((i = 0; i < 100; i++)); do
      grep -a -q -E "@peercm-roce/$(id -u)/[0-9.]+/port/$1\$" /proc/net/unix && { sleep 0.1; return 0; }
      sleep 0.1
    done
    fail "no RoCE listener on port $1 after 10 s"
  fi
  for ((i = 0; i < 50; i++)); do
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  fail "no listener on port $1 after 5 s"
}

# pair TIMEOUT -- SERVER ARGV -- CLIENT ARGV: both must exit 0. The server is ready when
# $ready_port listens (TCP; ready_kind=cm over RoCE: a pause, its listener being UDP).
pair() {
  local limit=$1; shift 2
  local server=() client=()
  while [[ $1 != -- ]]; do server+=("$1"); shift; done
  shift
  client=("$@")
  # a simple command, not a function, so that $! is the process itself (no subshell between)
  "$tool" exec --transport "$transport" -- timeout -k 2 "$((limit + 5))" "${server[@]}" \
    > "$work/server.out" 2> "$work/server.err" &
  server_pid=$!
  wait_listener "$ready_port" "${ready_kind:-cm}"
  run timeout -k 2 "$limit" "${client[@]}" > "$work/client.out" 2> "$work/client.err"
  local client_rc=$?
  if ((client_rc != 0)) && [[ -n ${retry_signature:-} ]] && grep -a -q -E "$retry_signature" "$work/client.err"; then
    stop_server
    lost_race=1
    return
  fi
  ((client_rc == 0)) || fail "client exit $client_rc"
  # A server that serves until stopped (persistent_server=1) is stopped once its client is done.
  if ((${persistent_server:-0})); then
    kill -0 "$server_pid" 2> /dev/null || fail "the server ended before it was stopped"
    stop_server
    return
  fi
  wait "$server_pid"
  local server_rc=$?
  server_pid=
  ((server_rc == 0)) || fail "server exit $server_rc"
}

# perftest's result table: the line after '#bytes' must give the size and iteration count
# asked for, and every figure on it must be a positive number.
check_perftest_table() {  # SIZE ITERATIONS
  local line
  line=$(grep -a -A1 '#bytes' "$work/client.out" | grep -a -E '^\s*[0-9]' | head -1)
  [[ -n $line ]] || fail "no result line after '#bytes' for size $1"
  read -r -a fields <<< "$line"
  ((${#fields[@]} >= 5)) || fail "short result line: $line"
  [[ ${fields[0]} == "$1" ]] || fail "size ${fields[0]} in the table, $1 asked: $line"
  [[ ${fields[1]} == "$2" ]] || fail "${fields[1]} iterations in the table, $2 asked: $line"
  local figure
  for figure in "${fields[@]:2}"; do
    # t_stdev is the one figure that may be 0 (it is a spread, not a measure)
    awk -v x="$figure" 'BEGIN { exit !(x + 0 >= 0 && x ~ /^[0-9.]+$/) }' || fail "figure '$figure' is not a number: $line"
  done
  awk -v x="${fields[2]}" 'BEGIN { exit !(x + 0 > 0) }' || fail "first figure not positive: $line"
  echo "$case -s $1: $line"
}

perftest() {  # PROGRAM MODE(R|noR)
  local name=$1 mode=$2 opts=() iterations=200 size
  [[ $mode == R ]] && opts+=(-R)
  # -d picks the device by name; over RoCE -g 0 is the GID of the context's own address
  [[ $transport == roce ]] && opts+=(-d peercm_roce0 -x 0) || opts+=(-d peercm_iw0)
  ready_kind=tcp
  [[ $mode == R ]] && ready_kind=cm
  # perftest 4.5-0.17 -R connects its test QP right after its last exchange on the first
  # connection, racing the server's rdma_listen of that port. A client that loses is refused
  # (REJECTED, ECONNREFUSED, as the kernel's IB CM answers a REQ for a port nobody listens on)
  # and its retry then reuses the ids it has just destroyed: it crashes (upstream perftest
  # reallocates them since). How often the client loses depends on scheduling, on both
  # transports, and on the load. A run that lost is run again with connect_head_start.c
  # preloaded into the client (its second rdma_connect waits), longer at each attempt
  # (20, 200, 1000 ms), and the case's later sizes keep the last wait. Any other failure fails
  # the case.
  retry_signature=
  [[ $mode == R ]] && retry_signature='RDMA_CM_EVENT_REJECTED; error: -111'
  local attempt preload=() head_starts=(20 200 1000)
  for size in 8 65536 1048576; do
    for attempt in 1 2 3 4; do
      lost_race=0
      ready_port=$(free_port)
      pair 45 -- "$name" "${opts[@]}" -p "$ready_port" -s "$size" -n "$iterations" \
        -- "${preload[@]}" "$name" "${opts[@]}" -p "$ready_port" -s "$size" -n "$iterations" 127.0.0.1
      ((lost_race)) || break
      echo "$case -s $size: attempt $attempt lost perftest's connect/listen race (REJECTED -111)"
      [[ -n $head_start ]] || fail "lost perftest's race and no head-start library was given"
      ((attempt <= ${#head_starts[@]})) || break
      preload=(env "LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}$head_start"
               "HEAD_START_MS=${head_starts[attempt - 1]}")
    done
    ((lost_race)) && fail "perftest's client lost the connect/listen race 4 times"
    check_perftest_table "$size" "$iterations"
  done
}

case $program in
  rping)
    ready_port=$(free_port)
    pair 40 -- rping -s -a "$address" -p "$ready_port" -v -V -C 100 -- rping -c -a "$address" -p "$ready_port" -v -V -C 100
    pings=$(grep -a -c '^ping data: rdma-ping-' "$work/client.out")
    ((pings == 100)) || fail "client printed $pings of 100 verified pings"
    ! grep -a -q -i 'mismatch' "$work/client.out" "$work/client.err" || fail "data mismatch"
    echo "$case: 100 pings, data verified (-V)"
    ;;
  rping_one_address)
    # Server and client processes on one address (RoCE: they share its UDP 4791;
    # docs/roce-transport.md, "Several processes on one address"): -I binds the client there.
    ready_port=$(free_port)
    pair 40 -- rping -s -a "$address" -p "$ready_port" -v -V -C 100 -- \
      rping -c -a "$address" -I "$address" -p "$ready_port" -v -V -C 100
    pings=$(grep -a -c '^ping data: rdma-ping-' "$work/client.out")
    ((pings == 100)) || fail "client printed $pings of 100 verified pings"
    ! grep -a -q -i 'mismatch' "$work/client.out" "$work/client.err" || fail "data mismatch"
    echo "$case: 100 pings from a client on the server's address, data verified (-V)"
    ;;
  ucmatose)
    ready_port=$(free_port)
    pair 30 -- ucmatose -b "$address" -p "$ready_port" -- ucmatose -s "$address" -p "$ready_port"
    grep -a -q 'test complete' "$work/client.out" || fail "client: no 'test complete'"
    grep -a -q 'test complete' "$work/server.out" || fail "server: no 'test complete'"
    echo "$case: $(grep -a -c 'test complete' "$work/client.out") test complete (client)"
    ;;
  rdma_server)
    ready_port=$(free_port)
    # rdma_server listens on every address: the client connects to 127.0.0.1
    pair 30 -- rdma_server -p "$ready_port" -- rdma_client -s 127.0.0.1 -p "$ready_port"
    grep -a -q 'rdma_server: end 0' "$work/server.out" || fail "server: no 'end 0'"
    grep -a -q 'rdma_client: end 0' "$work/client.out" || fail "client: no 'end 0'"
    echo "$case: rdma_server and rdma_client end 0"
    ;;
  cmtime)
    # rdma-core 44's cmtime: a server and a client, connections made and torn down in steps
    ready_port=$(free_port)
    persistent_server=1  # rdma-core 44's cmtime server serves until it is stopped
    pair 60 -- cmtime -b "$address" -p "$ready_port" -c 50 -- cmtime -s "$address" -p "$ready_port" -c 50
    grep -a -q -E '^\s*connect\s' "$work/client.out" || fail "client: no 'connect' step in its table"
    echo "$case: $(grep -a -E '^\s*(step|connect)\s' "$work/client.out" | tr -s ' \t' ' ' | paste -sd'|')"
    ;;
  udaddy)
    ready_port=
    # udaddy's -p is its port space; it always uses port 7174 (each run on its own address)
    pair 30 -- udaddy -b "$address" -- udaddy -s "$address"
    grep -a -q 'test complete' "$work/client.out" || fail "client: no 'test complete'"
    grep -a -q 'return status 0' "$work/client.out" || fail "client: no 'return status 0'"
    echo "$case: $(grep -a -m1 -E 'receiving|complete' "$work/client.out"), return status 0"
    ;;
  rstream | riostream)
    ready_port=$(free_port)
    ready_kind=tcp
    pair 40 -- "$program" -p "$ready_port" -S 65536 -C 1000 -- "$program" -s 127.0.0.1 -p "$ready_port" -S 65536 -C 1000
    line=$(grep -a -E '^custom\s+64k\s+1k\s' "$work/client.out")
    [[ -n $line ]] || fail "client: no 64k result line"
    echo "$case: $line"
    ;;
  ibv_devices)
    run timeout 20 ibv_devices > "$work/client.out" 2> "$work/client.err" || fail "exit $?"
    grep -a -q -E '^\s*peercm_iw0\s+[0-9a-f]{16}$' "$work/client.out" || fail "peercm_iw0 with its GUID not listed"
    grep -a -q -E '^\s*peercm_roce0\s+[0-9a-f]{16}$' "$work/client.out" || fail "peercm_roce0 with its GUID not listed"
    echo "$case: both devices listed with their GUIDs"
    ;;
  ibv_devinfo)
    run timeout 20 ibv_devinfo -v > "$work/client.out" 2> "$work/client.err" || fail "exit $?"
    out=$work/client.out
    grep -a -q -E '^hca_id:\s+peercm_iw0$' "$out" || fail "no hca_id peercm_iw0"
    grep -a -q -E '^hca_id:\s+peercm_roce0$' "$out" || fail "no hca_id peercm_roce0"
    grep -a -q -E 'transport:\s+iWARP \(1\)' "$out" || fail "no iWARP transport"
    grep -a -q -E 'transport:\s+InfiniBand \(0\)' "$out" || fail "no InfiniBand transport (the RoCE device)"
    grep -a -q -E 'fw_ver:\s+peercm ' "$out" || fail "no fw_ver"
    (($(grep -a -c -E 'state:\s+PORT_ACTIVE \(4\)' "$out") == 2)) || fail "not two active ports"
    (($(grep -a -c -E 'link_layer:\s+Ethernet' "$out") == 2)) || fail "not two Ethernet link layers"
    grep -a -q -E 'max_qp_wr:\s+16384' "$out" || fail "max_qp_wr not 16384"
    grep -a -q -E 'GID\[\s*0\]:\s+::ffff:127\.' "$out" || fail "RoCE GID 0 is not an IPv4-mapped 127/8 address"
    echo "$case: two devices, ports active, RoCE GID 0 $(grep -a -m1 -o -E 'GID\[\s*0\]:\s+::ffff:127\.[0-9.]+' "$out")"
    ;;
  ibv_rc_pingpong | ibv_ud_pingpong | ibv_srq_pingpong)
    ready_port=$(free_port)
    ready_kind=tcp
    opts=(-d peercm_roce0 -g 0 -n 200)
    [[ $program == ibv_ud_pingpong ]] && opts+=(-s 1024)
    pair 30 -- "$program" "${opts[@]}" -p "$ready_port" -- "$program" "${opts[@]}" -p "$ready_port" 127.0.0.1
    for side in client server; do
      grep -a -q -E '^[0-9]+ bytes in [0-9.]+ seconds' "$work/$side.out" || fail "$side: no 'bytes in' line"
      grep -a -q -E '^200 iters in' "$work/$side.out" || fail "$side: not 200 iterations"
    done
    echo "$case: $(grep -a -E 'iters in' "$work/client.out")"
    ;;
  ib_send_lat_R | ib_write_lat_R | ib_read_lat_R | ib_send_bw_R | ib_write_bw_R | ib_read_bw_R)
    perftest "${program%_R}" R
    ;;
  ib_send_lat_noR | ib_write_lat_noR | ib_read_lat_noR | ib_send_bw_noR | ib_write_bw_noR | ib_read_bw_noR)
    perftest "${program%_noR}" noR
    ;;
  *)
    echo "unknown case $case" >&2
    exit 2
    ;;
esac
