# Sourced by the benchmarks that run Debian's perftest on peercm through `peercm exec`
# (bench/dropin_vs_native.sh, bench/perftest_tails.sh). Expects `build` (a build directory)
# and `work` (a scratch directory) to be set, and the repository root as the working directory.
peercm=$build/tools/peercm/peercm
# perftest 4.5-0.17's -R client connects its test QP racing the server's second rdma_listen,
# and its retry after losing crashes (tests/dropin/run_case.sh): this library, preloaded into
# the client, makes its second rdma_connect wait 20 ms.
head_start=$build/tests/dropin/libdropin_connect_head_start.so
if [[ ! -x $peercm || ! -e $build/dropin/libibverbs.so.1 || ! -e $head_start ]]; then
  cmake --preset release > /dev/null && cmake --build "$build" --target peercm_tool peercm_dropin_ibverbs \
    peercm_dropin_rdmacm peercm_dropin_mlx5 peercm_dropin_efa dropin_connect_head_start > /dev/null || exit 1
fi

free_port() { python3 scripts/lib/free_port.py; }

wait_tcp() {
  local i
  for ((i = 0; i < 50; i++)); do
    ss -Hltn "sport = :$1" 2> /dev/null | grep -q . && return 0
    sleep 0.1
  done
  return 1
}

# One perftest program, server and client on loopback, connected with -R (rdma_cm); their
# outputs in $work/server.out and $work/client.out.
perftest_pair() {  # TRANSPORT PROGRAM SIZE ITERATIONS
  local transport=$1 program=$2 size=$3 n=$4 port opts=()
  port=$(free_port)
  if [[ $transport == iwarp ]]; then opts=(-d peercm_iw0 -R); else opts=(-d peercm_roce0 -R); fi
  "$peercm" exec --transport "$transport" -- timeout 120 "$program" "${opts[@]}" -p "$port" -s "$size" -n "$n" \
    > "$work/server.out" 2>&1 &
  local server=$!
  # iWARP: the rdma_cm listener is a TCP socket; RoCE's is the UDP 4791 one: a pause
  if [[ $transport == iwarp ]]; then wait_tcp "$port"; else sleep 1; fi
  "$peercm" exec --transport "$transport" -- env "LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}$head_start" \
    timeout 120 "$program" "${opts[@]}" -p "$port" -s "$size" -n "$n" 127.0.0.1 > "$work/client.out" 2>&1
  wait "$server"
}

# The first row of the client's result table: "#bytes #iterations ..." values.
perftest_row() { grep -a -A1 '#bytes' "$work/client.out" | grep -a -E '^\s*[0-9]' | head -1; }
