#!/usr/bin/env bash
# Side-by-side benchmark on loopback: peercm against raw TCP (peercm perf's in-process
# baseline, sockperf, iperf3), libfabric's tcp provider (fi_pingpong -p tcp -e msg) and UCX
# over TCP (ucx_perftest, UCX_TLS=tcp), plus connection setup (peercm cmtime against plain
# TCP; peercm mesh against the first MPI_Alltoall of Open MPI over its TCP BTL).
#
#   bench/side_by_side.sh [--reps N] [--out DIR] [--bw-mib M] [--connections C] [--ranks R]
#                         [--port-base P] [--no-mpi] [--no-netns] [--pin] [--profile]
#
#   --reps N         repetitions of the whole matrix (default 5); medians over them
#   --out DIR        output folder (default build/bench-side-by-side/<timestamp>)
#   --bw-mib M       MiB moved per streaming-bandwidth sample (default 256)
#   --connections C  peercm cmtime connections (default 100)
#   --ranks R        ranks of peercm mesh and of the MPI all-to-all (default 8)
#   --port-base P    first of the fixed ports of the tool servers (default 47600; the next
#                    free block of 4 is taken if one is busy)
#   --no-mpi         skip the Open MPI row;  --no-netns: skip UCX's multi-rail row
#   --pin            pin the busy-polling contenders, for exploring (the default leaves them
#                    unpinned, the configuration a user gets): each end of a busy-polling
#                    latency or ping-pong run keeps to its own CPU, as perftest is run under
#                    taskset: peercm perf --pin, fi_pingpong and ucx_perftest under taskset
#                    (server on the first allowed CPU, client on the second). peercm's TCP
#                    baseline is pinned the same way, and measured once more with both ends
#                    on one CPU (a row of its own). sockperf and iperf3 stay unpinned.
#   --profile        also count system calls per message (strace -f) of peercm, its TCP
#                    baseline, fi_pingpong and ucx_perftest: DIR/profile.md, in results.md
#   PEERCM=path      use this peercm binary and skip the build (development)
#
# Writes DIR/results.md (Markdown tables, targets), DIR/raw.csv (every sample), DIR/plot.png
# (gnuplot), DIR/machine.txt, DIR/times.csv (seconds per sample) and DIR/logs/ (each tool's
# raw output).
#
# Units: latency is one-way (half the round trip) in µs for every tool; bandwidth in GB/s
# (10^9 B/s). Per repetition the contenders of each (metric, size) run one after the other
# in an order that rotates every repetition (A B C, B C A, ...), so slow drifts of the shared
# machine's load hit all of them alike; every ratio is against raw TCP measured in the same
# run. All traffic stays on 127.0.0.1, except UCX's multi-rail reference row, which runs in a
# private network namespace with lo and a veth pair (two extra "rails") that this script
# creates and removes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/apt.sh
source scripts/lib/apt.sh

reps=5
out=
bw_mib=256
connections=100
ranks=8
port_base=47600
use_mpi=1
use_netns=1
use_pin=0
profile=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bw-mib) bw_mib=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --port-base) port_base=$2; shift 2 ;;
    --no-mpi) use_mpi=0; shift ;;
    --no-netns) use_netns=0; shift ;;
    --pin) use_pin=1; shift ;;
    --profile) profile=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "side_by_side: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "side_by_side: --reps must be a positive integer" >&2; exit 2; }
for v in "$bw_mib" "$connections" "$ranks" "$port_base"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "side_by_side: $v is not a positive integer" >&2; exit 2; }
done
started=$(date +%s)
out=${out:-build/bench-side-by-side/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
index=$out/index.tsv
printf 'rep\tseq\tkind\tlog\tgroup\tsize\tcontender\tkeep\n' >"$index"
echo "seq,rep,group,size,contender,seconds" >"$out/times.csv"
report=(python3 "$root/bench/side_by_side_report.py")
# --pin: the CPUs the two ends of a busy-polling run keep to (taskset prefixes).
server_pin=() client_pin=() peercm_pin=()
if ((use_pin)); then
  read -r cpu_a cpu_b < <(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(c[0], c[1 % len(c)])')
  server_pin=(taskset -c "$cpu_a") client_pin=(taskset -c "$cpu_b") peercm_pin=(--pin)
fi

# ---- tools and build ---------------------------------------------------------------------
tools=(libfabric-bin ucx-utils sockperf iperf3 gnuplot-nox openmpi-bin libopenmpi-dev iproute2 python3)
((profile)) && tools+=(strace)
apt_ensure --tag side_by_side "${tools[@]}"
if [[ -n ${PEERCM:-} ]]; then
  peercm=$PEERCM
  echo "side_by_side: using PEERCM=$peercm (no build)"
else
  # At most 2 compile jobs (2-core shared machine); a build colliding with another one in the
  # same tree is retried once.
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
  bash scripts/build.sh release || { sleep 5; bash scripts/build.sh release; }
  peercm=$root/build/release/tools/peercm/peercm
fi
[[ -x $peercm ]] || { echo "side_by_side: $peercm is not executable" >&2; exit 1; }
# Run a snapshot of the binary and of libpeercm.so: the tree is shared, and a rebuild of
# build/release during the run must not change (or break) what is measured.
snap=$out/bin
mkdir -p "$snap"
cp "$peercm" "$snap/peercm"
lib=$(ldd "$peercm" | awk '$1 ~ /^libpeercm/ && $3 ~ /^\// {print $3}')
[[ -z $lib ]] || cp -L "$lib" "$snap/"
peercm_cmd=(env "LD_LIBRARY_PATH=$snap${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$snap/peercm")
"${peercm_cmd[@]}" --version >/dev/null || { echo "side_by_side: the peercm snapshot does not run" >&2; exit 1; }
prepared=$(date +%s)  # packages and build done
mpi_bin=$out/mpi_alltoall_first
if ((use_mpi)); then
  mpicc -O2 -o "$mpi_bin" bench/mpi_alltoall_first.c || { echo "side_by_side: mpicc failed, no MPI row" >&2; use_mpi=0; }
fi

# ---- servers and cleanup -----------------------------------------------------------------
servers=()   # pids of every background process this script started
netns=
cleanup() {
  local pid
  for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${servers[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ -n $netns ]]; then ip netns del "$netns" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

in_ns() { if [[ -n ${run_ns:-} ]]; then ip netns exec "$run_ns" "$@"; else "$@"; fi; }
listening() { in_ns ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
port_used() { ss -Htan "sport = :$1" 2>/dev/null | grep -q .; }  # any state, TIME_WAIT too
wait_listen() {  # port pid: until the server listens (10 s at most) or dies
  local i
  for ((i = 0; i < 200; i++)); do
    listening "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
forget_server() {
  local keep=() p
  for p in "${servers[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  servers=("${keep[@]}")
}
reap() {  # pid: a one-shot server exits after its client; kill it if not within 5 s
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  forget_server "$1"
}

# Four fixed ports: fi_pingpong control, ucx_perftest, sockperf, iperf3. Another run of the
# suite (the tree is shared), or the TIME_WAIT sockets of an earlier one (sockperf binds
# without SO_REUSEADDR), may hold them: take the next free block.
for ((try = 0; try < 50; try++)); do
  busy=0
  for off in 0 1 2 3; do if port_used $((port_base + off)); then busy=1; fi; done
  ((busy)) || break
  port_base=$((port_base + 10))
done
fi_port=$port_base ucx_port=$((port_base + 1)) sock_port=$((port_base + 2)) iperf_port=$((port_base + 3))

# UCX's default device selection ("every interface", multi-rail) without sending anything to
# the host's own interface address: a private namespace with lo and a veth pair.
if ((use_netns)); then
  # Namespaces of earlier runs that were killed (SIGKILL skips the trap) and whose script is gone.
  for old in $(ip netns list 2>/dev/null | awk '$1 ~ /^pcm-sbs-[0-9]+$/ {print $1}'); do
    kill -0 "${old#pcm-sbs-}" 2>/dev/null || ip netns del "$old" 2>/dev/null || true
  done
  ns=pcm-sbs-$$
  if [[ $(id -u) -eq 0 ]] && ip netns add "$ns" 2>/dev/null; then
    netns=$ns
    if ! { ip -n "$ns" link set lo up &&
      ip -n "$ns" link add sbs0 type veth peer name sbs1 &&
      ip -n "$ns" addr add 10.78.0.1/24 dev sbs0 && ip -n "$ns" addr add 10.78.1.1/24 dev sbs1 &&
      ip -n "$ns" link set sbs0 up && ip -n "$ns" link set sbs1 up; }; then
      echo "side_by_side: cannot set up namespace $ns: no UCX multi-rail row" >&2
      use_netns=0
    fi
  else
    echo "side_by_side: no network namespace (needs root): no UCX multi-rail row" >&2
    use_netns=0
  fi
fi

# Long-running servers: sockperf and iperf3 (each serves one client at a time).
timeout 7200 sockperf server --tcp -i 127.0.0.1 -p "$sock_port" >"$out/logs/sockperf-server.txt" 2>&1 &
sock_pid=$!
servers+=("$sock_pid")
timeout 7200 iperf3 -s -B 127.0.0.1 -p "$iperf_port" >"$out/logs/iperf3-server.txt" 2>&1 &
iperf_pid=$!
servers+=("$iperf_pid")
wait_listen "$sock_port" "$sock_pid" || { echo "side_by_side: sockperf server did not start" >&2; exit 1; }
wait_listen "$iperf_port" "$iperf_pid" || { echo "side_by_side: iperf3 server did not start" >&2; exit 1; }

# Round trips per latency sample of fi_pingpong and ucx_perftest (peercm perf uses its own
# defaults: 1000, 100 above 64 KiB). The busy-polling tools take up to ~1 ms per round trip
# when their two processes share a core, so the larger sizes get fewer.
lat_iters() {  # size -> iterations
  if (($1 <= 4096)); then echo 500; elif (($1 <= 65536)); then echo 100; else echo 30; fi
}
bw_iters() { echo $(((bw_mib << 20) / $1)); }

# ---- machine ------------------------------------------------------------------------------
{
  echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores" \
    "($(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s) per core)," \
    "$(free -g | awk '/^Mem:/ {print $2}') GiB, kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME")."
  echo "Load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (shared machine)."
  echo "peercm $("${peercm_cmd[@]}" --version 2>/dev/null | head -1) (sha256 $(cat "$snap"/* | sha256sum | cut -c1-12)) at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' + uncommitted changes');" \
    "libfabric $(fi_info --version | sed -n 's/^libfabric: *//p');" \
    "UCX $(ucx_info -v | sed -n 's/^# Version *//p');" \
    "sockperf $(sockperf --version 2>&1 | sed -n 's/.*version \([0-9.]*\).*/\1/p' | head -1);" \
    "iperf3 $(iperf3 --version | sed -n '1s/^iperf \([0-9.]*\).*/\1/p');" \
    "Open MPI $(mpirun --version 2>/dev/null | sed -n '1s/.*) //p')."
  echo "Command: bench/side_by_side.sh --reps $reps --bw-mib $bw_mib --connections $connections --ranks $ranks$( ((use_pin)) && echo ' --pin')."
  if ((use_pin)); then
    echo "Pinning: busy-polling ends on their own CPUs (peercm perf --pin, its TCP baseline too; fi_pingpong and ucx_perftest server on CPU $cpu_a, client on CPU $cpu_b); sockperf and iperf3 unpinned."
  fi
  echo "Samples: peercm perf defaults (latency 1000 round trips, 100 above 64 KiB; window 64); fi_pingpong and" \
    "ucx_perftest $(lat_iters 8) round trips at 8 B/4 KiB, $(lat_iters 65536) at 64 KiB, $(lat_iters 1048576) at 1 MiB;" \
    "sockperf 1 s; streaming ${bw_mib} MiB per sample (peercm, UCX, iperf3)."
} >"$out/machine.txt"
cat "$out/machine.txt"

# ---- contenders ----------------------------------------------------------------------------
seq_no=0
emit() {  # kind log group size contender [keep]: parsed at the end, in one python run
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$seq_no" "$1" "$2" "$3" "$4" "$5" "${6:-}" >>"$index"
}
logfile() { echo "$out/logs/$(printf '%03d' "$seq_no")-r$rep-$1-$2-$3.txt"; }


run_peercm() {  # group size op crc progress
  local group=$1 size=$2 op=$3 crc=$4 progress=$5 mode=lat args=() name log
  name=peercm-$op-$crc
  [[ $progress == thread ]] || name+=-$progress
  [[ $group == bw ]] && mode=bw && args=(--iters "$(bw_iters "$size")")
  log=$(logfile "$name" "$group" "$size")
  if timeout 180 "${peercm_cmd[@]}" perf --loopback --json --op "$op" --mode "$mode" --size "$size" \
    --crc "$crc" --progress "$progress" "${peercm_pin[@]}" "${args[@]}" >"$log" 2>&1; then
    emit peercm "$log" "$group" "$size" "$name"
  else
    echo "side_by_side: $name $group $size failed (rc $?): see $log" >&2
  fi
}

run_sockperf() {  # group size (latency only; sockperf's smallest TCP message is 14 B)
  local size=$2 msg=$2 log
  ((msg >= 14)) || msg=14
  log=$(logfile sockperf "$1" "$size")
  if timeout 60 sockperf ping-pong --tcp -i 127.0.0.1 -p "$sock_port" -m "$msg" -t 1 >"$log" 2>&1; then
    echo "-m $msg" >>"$log"
    emit sockperf "$log" "$1" "$size" sockperf
  else
    echo "side_by_side: sockperf $size failed: see $log" >&2
  fi
}

run_iperf3() {  # group size (streaming bandwidth)
  local size=$2 log
  log=$(logfile iperf3 "$1" "$size")
  if timeout 120 iperf3 -c 127.0.0.1 -p "$iperf_port" -l "$size" -n "$((bw_mib << 20))" -J >"$log" 2>&1; then
    emit iperf3 "$log" "$1" "$size" iperf3
  else
    echo "side_by_side: iperf3 $size failed: see $log" >&2
  fi
}

run_fi() {  # group size: fi_pingpong over the tcp provider's msg endpoint, kept on lo
  local size=$2 iters log spid
  iters=$(lat_iters "$size")
  log=$(logfile libfabric "$1" "$size")
  FI_TCP_IFACE=lo timeout 180 "${server_pin[@]}" fi_pingpong -p tcp -e msg -B "$fi_port" -I "$iters" -S "$size" \
    >"$log.server" 2>&1 &
  spid=$!
  servers+=("$spid")
  if wait_listen "$fi_port" "$spid" &&
    FI_TCP_IFACE=lo timeout 180 "${client_pin[@]}" fi_pingpong -p tcp -e msg -P "$fi_port" -I "$iters" -S "$size" \
      127.0.0.1 >"$log" 2>&1; then
    emit fabric "$log" "$1" "$size" libfabric
  else
    echo "side_by_side: fi_pingpong $size failed: see $log" >&2
  fi
  reap "$spid"
}

run_ucx() {  # group size variant(lo|mr)
  local group=$1 size=$2 variant=$3 test iters warmup keep log spid env=(UCX_TLS=tcp) run_ns=
  if [[ $variant == lo ]]; then env+=(UCX_NET_DEVICES=lo); else run_ns=$netns; fi
  if [[ $group == bw ]]; then
    # 16 warm-up messages: what peercm perf gives its streams (and its TCP baseline) by default.
    test=tag_bw iters=$(bw_iters "$size") warmup=16 keep=GBps
  else
    test=tag_lat iters=$(lat_iters "$size") warmup=$(($(lat_iters "$size") / 10)) keep=p50_us,mean_us
  fi
  log=$(logfile "ucx-$variant" "$group" "$size")
  in_ns env "${env[@]}" timeout 180 "${server_pin[@]}" ucx_perftest -p "$ucx_port" >"$log.server" 2>&1 &
  spid=$!
  servers+=("$spid")
  if wait_listen "$ucx_port" "$spid" &&
    in_ns env "${env[@]}" timeout 180 "${client_pin[@]}" ucx_perftest 127.0.0.1 -p "$ucx_port" -t "$test" -s "$size" \
      -n "$iters" -w "$warmup" -f -v >"$log" 2>&1; then
    emit ucx "$log" "$group" "$size" "ucx-$variant" "$keep"
  else
    echo "side_by_side: ucx_perftest $variant $test $size failed: see $log" >&2
  fi
  reap "$spid"
}

run_cmtime() {  # mode
  local name=cmtime-${1/client-server/cs} log
  log=$(logfile "$name" setup "$connections")
  if timeout 180 "${peercm_cmd[@]}" cmtime --connections "$connections" --mode "$1" --json >"$log" 2>&1; then
    emit cmtime "$log" setup "$connections" "$name"
  else
    echo "side_by_side: cmtime $1 failed: see $log" >&2
  fi
}

run_mesh() {
  local log
  log=$(logfile peercm-mesh mesh "$ranks")
  if timeout 180 "${peercm_cmd[@]}" mesh --ranks "$ranks" --model p2p --size 8 --json --timeout 60 >"$log" 2>&1; then
    emit mesh "$log" mesh "$ranks" peercm-mesh
  else
    echo "side_by_side: peercm mesh failed: see $log" >&2
  fi
}

run_mpi() {  # start: init|barrier
  local log args=()
  [[ $1 == barrier ]] && args=(--barrier)
  log=$(logfile "mpi-$1" mesh "$ranks")
  # btl tcp,self: TCP even between ranks on one node; if_include lo: loopback only.
  if timeout 180 mpirun --allow-run-as-root --oversubscribe -np "$ranks" \
    --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$mpi_bin" "${args[@]}" >"$log" 2>&1; then
    emit mpi "$log" mesh "$ranks" "mpi-$1"
  else
    echo "side_by_side: mpirun ($1) failed: see $log" >&2
  fi
}

# One (group, size) cell: every contender once, in an order rotated by the repetition.
run_cell() {  # group size contender...
  local group=$1 size=$2 n i c
  shift 2
  local list=("$@")
  n=${#list[@]}
  for ((i = 0; i < n; i++)); do
    c=${list[$(((i + rep) % n))]}
    seq_no=$((seq_no + 1))
    t0=$(date +%s.%N)
    case $c in
      peercm:*) IFS=: read -r _ op crc progress <<<"$c"; run_peercm "$group" "$size" "$op" "$crc" "$progress" ;;
      sockperf) run_sockperf "$group" "$size" ;;
      iperf3) run_iperf3 "$group" "$size" ;;
      libfabric) run_fi "$group" "$size" ;;
      ucx-lo) run_ucx "$group" "$size" lo ;;
      ucx-mr) run_ucx "$group" "$size" mr ;;
      cmtime-cs) run_cmtime client-server ;;
      cmtime-p2p) run_cmtime p2p ;;
      mesh) run_mesh ;;
      mpi-init) run_mpi init ;;
      mpi-barrier) run_mpi barrier ;;
    esac
    echo "$seq_no,$rep,$group,$size,$c,$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')" >>"$out/times.csv"
  done
}

peercm_variants=(peercm:send:off:thread peercm:send:on:thread peercm:write:off:thread peercm:write:on:thread)
ucx=(ucx-lo)
((use_netns)) && ucx+=(ucx-mr)
lat_contenders=("${peercm_variants[@]}" peercm:send:off:inline libfabric "${ucx[@]}" sockperf)
pp_contenders=("${peercm_variants[@]}" peercm:send:off:inline libfabric ucx-lo)
bw_contenders=("${peercm_variants[@]}" "${ucx[@]}" iperf3)
setup_contenders=(cmtime-cs cmtime-p2p mesh)
((use_mpi)) && setup_contenders+=(mpi-init mpi-barrier)

for ((rep = 1; rep <= reps; rep++)); do
  echo "side_by_side: repetition $rep/$reps (load $(cut -d' ' -f1 /proc/loadavg), $(($(date +%s) - started)) s)"
  for size in 8 4096; do run_cell lat "$size" "${lat_contenders[@]}"; done
  for size in 65536 1048576; do run_cell pp "$size" "${pp_contenders[@]}"; done
  for size in 65536 1048576; do run_cell bw "$size" "${bw_contenders[@]}"; done
  run_cell setup "$connections" "${setup_contenders[@]}"
done

# ---- system calls per message (one run each, under strace: slower, so fewer messages) ------
run_profile() {
  local dir=$out/profile md=$out/profile.md spid n
  mkdir -p "$dir"
  local sys=("${report[@]}" syscalls)
  {
    echo "| run | threads | system calls per message | top calls per message |"
    echo "|---|---|---|---|"
  } >"$md"
  prof_peercm() {  # label messages perf-args...
    local label=$1 messages=$2 log
    shift 2
    log=$dir/$(echo "$label" | tr ' ,/' '___').strace
    if timeout 300 strace -f -ttt -qq -o "$log" "${peercm_cmd[@]}" perf --loopback --json "$@" >"$log.json" 2>&1; then
      "${sys[@]}" --label "$label" --messages "$messages" --split "$log" >>"$md" || true
    fi
  }
  prof_peercm "peercm Send 8 B ping-pong, per round trip" 1100 --op send --mode lat --size 8 --crc off
  prof_peercm "peercm Send 8 B ping-pong inline, per round trip" 1100 --op send --mode lat --size 8 --crc off --progress inline
  prof_peercm "peercm Send 64 KiB stream, per message" 2048 --op send --mode bw --size 65536 --crc off --iters 2048
  prof_peercm "peercm Write 1 MiB stream, per message" 128 --op write --mode bw --size 1048576 --crc off --iters 128
  prof_peercm "peercm Write 1 MiB stream CRC on, per message" 128 --op write --mode bw --size 1048576 --crc on --iters 128
  n=1000
  FI_TCP_IFACE=lo timeout 300 strace -f -ttt -qq -o "$dir/fi.server.strace" \
    fi_pingpong -p tcp -e msg -B "$fi_port" -I "$n" -S 8 >/dev/null 2>&1 &
  spid=$!
  servers+=("$spid")
  if wait_listen "$fi_port" "$spid" && FI_TCP_IFACE=lo timeout 300 strace -f -ttt -qq -o "$dir/fi.client.strace" \
    fi_pingpong -p tcp -e msg -P "$fi_port" -I "$n" -S 8 127.0.0.1 >"$dir/fi.txt" 2>&1; then
    reap "$spid"
    "${sys[@]}" --label "libfabric fi_pingpong 8 B, per round trip (both processes)" --messages "$n" \
      "$dir/fi.server.strace" "$dir/fi.client.strace" >>"$md" || true
  else
    reap "$spid"
  fi
  env UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 300 strace -f -ttt -qq -o "$dir/ucx.server.strace" \
    ucx_perftest -p "$ucx_port" >/dev/null 2>&1 &
  spid=$!
  servers+=("$spid")
  if wait_listen "$ucx_port" "$spid" && env UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 300 strace -f -ttt -qq \
    -o "$dir/ucx.client.strace" ucx_perftest 127.0.0.1 -p "$ucx_port" -t tag_lat -s 8 -n "$n" -w 100 -f -v \
    >"$dir/ucx.txt" 2>&1; then
    reap "$spid"
    "${sys[@]}" --label "UCX tag_lat 8 B, per round trip (both processes)" --messages $((n + 100)) \
      "$dir/ucx.server.strace" "$dir/ucx.client.strace" >>"$md" || true
  else
    reap "$spid"
  fi
  rm -f "$dir"/*.strace  # large; the counts are in profile.md
}
if ((profile)); then
  echo "side_by_side: profiling system calls (strace)"
  rep=0
  run_profile
fi

elapsed=$(($(date +%s) - started))
{
  echo "Load average at end: $(cut -d' ' -f1-3 /proc/loadavg). Suite runtime: ${elapsed} s ($reps repetitions$( ((profile)) && echo ', --profile')), of which $((prepared - started)) s packages and build."
} >>"$out/machine.txt"
"${report[@]}" report "$out"
echo "side_by_side: done in ${elapsed} s: $out/results.md, $out/raw.csv, $out/plot.png"
