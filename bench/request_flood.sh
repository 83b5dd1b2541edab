#!/usr/bin/env bash
# What a request flood costs `peercm ping --server` (docs/reliability.md, "Requests a listener
# holds"): for each transport and each kind of request, a fresh server, then FLOOD_TOTAL
# connection requests from one address that never complete (tests/reliability/reliability_peer
# request-flood). A real `peercm ping` client runs a long Send ping first, so the server is busy
# with one client and every request of the flood waits in its listener. The server's descriptors and RSS are sampled every 20 ms;
# its CPU is read before and after.
#
#   bench/request_flood.sh [build dir, default build/release]     FLOOD_TOTAL=20000 by default,
#                                                                 FLOOD_TRANSPORTS="iwarp roce"
# The CPU column is the server's user + system time over the flood, and beside it the same
# for an equal time just before the flood (serving the client alone).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
total=${FLOOD_TOTAL:-20000}
peercm=$build/tools/peercm/peercm
flooder=$build/tests/reliability/reliability_peer
[[ -x $peercm && -x $flooder ]] || { echo "build $build first (targets peercm_tool, reliability_peer)" >&2; exit 1; }
tick=$(getconf CLK_TCK)

fds_of() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
rss_kib_of() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
cpu_ticks_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

printf '| transport | requests | sent | seen refused by the flooder | fds before → peak | RSS before → peak (MiB) | server CPU during the flood (same time without it) | flood time |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for transport in ${FLOOD_TRANSPORTS:-iwarp roce}; do
  for kind in cs p2p; do
    address=127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1))
    port=$((20000 + RANDOM % 20000))
    "$peercm" ping --server --bind "$address" --port "$port" --transport "$transport" >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    "$peercm" ping --client "$address" --port "$port" --transport "$transport" --count 100000000 >/dev/null 2>&1 &
    client=$!
    sleep 0.5
    base0=$(cpu_ticks_of $server)
    sleep 3
    base1=$(cpu_ticks_of $server)
    fds0=$(fds_of $server)
    rss0=$(rss_kib_of $server)
    cpu0=$(cpu_ticks_of $server)
    out=$(mktemp)
    start=$(date +%s.%N)
    # stdin from a pipe kept open by a sleeping writer: the flooder blocks after "done".
    # From an address of its own: a RoCE node is one address (the stopped client holds one).
    source=127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1))
    (sleep 600 | "$flooder" request-flood "$transport" "$kind" "$address" "$port" "$total" "$source" >"$out") 2>/dev/null &
    flood=$!
    peak_fds=$fds0
    peak_rss=$rss0
    while ! grep -q '^done' "$out" 2>/dev/null; do
      f=$(fds_of $server); r=$(rss_kib_of $server)
      ((f > peak_fds)) && peak_fds=$f
      ((r > peak_rss)) && peak_rss=$r
      kill -0 $server 2>/dev/null || { echo "server died" >&2; break; }
      sleep 0.02
    done
    end=$(date +%s.%N)
    cpu1=$(cpu_ticks_of $server)
    read -r _ sent _ refused < <(grep '^done' "$out")
    pkill -P $flood 2>/dev/null || true  # the flooder and the writer that keeps its stdin open
    wait $flood 2>/dev/null || true
    kill -9 $client 2>/dev/null || true
    kill $server 2>/dev/null || true
    wait $server $client 2>/dev/null || true
    rm -f "$out"
    name=$([[ $kind == p2p ]] && echo "p2p" || echo "client/server")
    printf '| %s | %s %s | %s | %s | %s → %s | %.1f → %.1f | %.2f s (%.2f s without) | %.1f s |\n' "$transport" "$total" "$name" "$sent" "$refused" \
      "$fds0" "$peak_fds" "$(echo "$rss0/1024" | bc -l)" "$(echo "$peak_rss/1024" | bc -l)" \
      "$(echo "($cpu1-$cpu0)/$tick" | bc -l)" "$(echo "($base1-$base0)/$tick * ($end-$start)/3" | bc -l)" \
      "$(echo "$end-$start" | bc -l)"
  done
done
