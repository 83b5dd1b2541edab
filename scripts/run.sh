#!/usr/bin/env bash
# The main job on loopback: set everything up, build, then
#   1. peercm ping: a server and a client exchange verified data with Send, RDMA Write and
#      RDMA Read (CRC on);
#   2. peercm mesh: 8 ranks connect all-to-all at the same moment with the peer-to-peer
#      model and must end with exactly one connection per pair.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
peercm=./build/release/tools/peercm/peercm

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$peercm" ping --server --bind 127.0.0.1 --port "$port" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
for op in send write read; do
  "$peercm" ping --client 127.0.0.1 --port "$port" --op "$op" --size 65536 --count 100 --crc on
done
kill $server 2>/dev/null || true

"$peercm" mesh --ranks 8 --model p2p
