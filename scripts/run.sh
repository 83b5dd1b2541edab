#!/usr/bin/env bash
# The main job on loopback: set everything up, build, then, over iWARP (MPA/TCP) and then
# over RoCEv2 (IB CM + RC over UDP 4791):
#   1. peercm ping: a server and a client exchange verified data with Send, RDMA Write and
#      RDMA Read (iWARP with CRC on);
#   2. peercm mesh: 8 ranks connect all-to-all at the same moment with the peer-to-peer
#      model and must end with exactly one connection per pair.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
peercm=./build/release/tools/peercm/peercm

server=
trap '[[ -n $server ]] && kill $server 2>/dev/null || true' EXIT

# Starts a ping server on $1 (port 0: a free one), waits for its "listening on ADDR:PORT"
# line and sets $port.
start_server() {
  local log; log=$(mktemp)
  "$peercm" ping --server --bind "$1" --port 0 "${@:2}" 2> "$log" &
  server=$!
  port=
  for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$log" | head -1)
    [[ -n $port ]] && break
    sleep 0.05
  done
  [[ -n $port ]] || { cat "$log" >&2; echo "the ping server did not start" >&2; exit 1; }
}

for transport in iwarp roce; do
  echo "=== $transport"
  if [[ $transport == iwarp ]]; then
    host=127.0.0.1
    start_server "$host" --crc on
    extra=(--crc on)
  else
    # A RoCE node is one address: the server takes a random 127/8 one of its own.
    host=127.$((RANDOM % 250 + 1)).$((RANDOM % 250)).$((RANDOM % 250 + 1))
    start_server "$host" --transport roce
    extra=(--transport roce)
  fi
  for op in send write read; do
    "$peercm" ping --client "$host" --port "$port" --op "$op" --size 65536 --count 100 "${extra[@]}"
  done
  kill $server 2>/dev/null || true
  wait $server 2>/dev/null || true
  server=
  "$peercm" mesh --ranks 8 --model p2p --transport "$transport"
done
