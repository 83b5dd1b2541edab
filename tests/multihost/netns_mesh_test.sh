#!/usr/bin/env bash
# Several hosts on one machine (design.md §6): N network namespaces pcm-ns0..N-1 with
# addresses 10.77.0.1..N/24 on a bridge that lives in a namespace of its own (pcm-nsbr), so
# that nothing is added to the host's own network. One `peercm mesh` rank runs in each
# namespace, bound to its own address; the ranks find each other with `--bootstrap file`
# through a fresh temporary directory. The JSON summary of rank 0 must show exactly
# N(N-1)/2 connections, no duplicate, every message verified.
#
#   netns_mesh_test.sh PEERCM [--ranks N=4] [--model p2p|static|naive] [--timeout SEC=15]
#   netns_mesh_test.sh PEERCM --loopback [...]
#       The same ranks and checks without namespaces, every rank on 127.0.0.1 (no root
#       needed): the file bootstrap with separately started ranks, on any machine.
#
# Needs root and iproute2. Exit 77 (CTest SKIP_RETURN_CODE) when not root, `ip` is missing
# or namespaces cannot be created here; 0 when the mesh passed; 1 otherwise. The namespaces
# and the directory are always removed (trap), and a run serialises with other runs of this
# test on the machine through a lock file (the namespace names are fixed).
set -u

skip() { echo "SKIP: $*"; exit 77; }
die() { echo "FAIL: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: $0 PEERCM [--ranks N] [--model M] [--timeout SEC]"
peercm=$1
shift
ranks=4
model=p2p
timeout=15
loopback=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --loopback) loopback=1; shift ;;
    *) die "unknown argument $1" ;;
  esac
done
[[ $ranks -ge 2 && $ranks -le 200 ]] || die "--ranks must be 2..200"
[[ -x $peercm ]] || die "$peercm is not executable"

command -v python3 >/dev/null 2>&1 || skip "python3 not found (checks the JSON)"
address() { if [[ $loopback -eq 1 ]]; then echo 127.0.0.1; else echo "10.77.0.$(($1 + 1))"; fi; }
in_namespace() { if [[ $loopback -eq 1 ]]; then "$@"; else ip netns exec "$prefix$rank" "$@"; fi; }
prefix=pcm-ns
work=
pids=()
namespaces=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [[ -n $work ]] && rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

started=$(date +%s.%N)
if [[ $loopback -eq 0 ]]; then
  [[ $(id -u) -eq 0 ]] || skip "not root: network namespaces need CAP_SYS_ADMIN"
  command -v ip >/dev/null 2>&1 || skip "ip (iproute2) not found"

  bridge_ns=${prefix}br
  namespaces=("$bridge_ns")
  for ((i = 0; i < ranks; i++)); do namespaces+=("$prefix$i"); done

  # One run at a time on this machine (two build trees may run their tests at once).
  lock=/run/lock/peercm-netns-test.lock
  [[ -d /run/lock ]] || lock=/tmp/peercm-netns-test.lock
  exec 9>"$lock"
  if command -v flock >/dev/null 2>&1; then
    flock -w 60 9 || die "another run holds $lock"
fi

# Left over by a run that was killed (SIGKILL skips the trap): ours by name, and we hold the lock.
for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done

ip netns add "$bridge_ns" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
set -e
ip -n "$bridge_ns" link add br0 type bridge
ip -n "$bridge_ns" link set br0 up
for ((i = 0; i < ranks; i++)); do
  ns=$prefix$i
  ip netns add "$ns"
  ip -n "$bridge_ns" link add "veth$i" type veth peer name eth0 netns "$ns"
  ip -n "$bridge_ns" link set "veth$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
done
set +e
fi
network_ready=$(date +%s.%N)

work=$(mktemp -d /tmp/peercm-netns-mesh.XXXXXX)
mkdir "$work/bootstrap"
for ((rank = 0; rank < ranks; rank++)); do
  in_namespace "$peercm" mesh --ranks "$ranks" --model "$model" --bootstrap file \
    --bootstrap-dir "$work/bootstrap" --rank "$rank" --bind "$(address "$rank")" --timeout "$timeout" --json -v \
    >"$work/out-$rank" 2>"$work/err-$rank" &
  pids+=($!)
done
failed=0
for ((i = 0; i < ranks; i++)); do
  wait "${pids[$i]}"
  status=$?
  if [[ $status -ne 0 ]]; then
    echo "rank $i: exit status $status" >&2
    failed=1
  fi
  [[ -s $work/err-$i ]] && sed "s/^/rank $i stderr: /" "$work/err-$i" >&2
done
pids=()
finished=$(date +%s.%N)
cat "$work/out-0"

python3 - "$work/out-0" "$ranks" "$model" <<'PY' || failed=1
import json, sys
path, n, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    s = json.loads(open(path).read())
except (OSError, ValueError) as e:
    print(f"FAIL: rank 0 printed no JSON summary ({e})", file=sys.stderr)
    sys.exit(1)
pairs = n * (n - 1) // 2
expect = {"ranks": n, "model": model, "bootstrap": "file", "expected_connections": pairs,
          "pairs_connected": pairs, "messages_verified": n * (n - 1), "messages_expected": n * (n - 1),
          "asymmetric_connections": 0, "ok": True}
if model != "naive":
    expect.update({"connections": pairs, "duplicates": 0})
bad = [f"{k} = {s.get(k)!r}, expected {v!r}" for k, v in expect.items() if s.get(k) != v]
if not isinstance(s.get("time_to_mesh_us"), int) or s["time_to_mesh_us"] <= 0:
    bad.append(f"time_to_mesh_us = {s.get('time_to_mesh_us')!r}")
for b in bad:
    print(f"FAIL: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY

python3 -c 'import sys; a, b, c, d = map(float, sys.argv[1:]); print(f"network setup {b - a:.2f} s, mesh run {c - b:.2f} s, total {d - a:.2f} s")' \
  "$started" "$network_ready" "$finished" "$(date +%s.%N)"
[[ $failed -eq 0 ]] || die "the mesh of $ranks separately started ranks failed"
if [[ $loopback -eq 1 ]]; then
  echo "PASS: $ranks ranks on 127.0.0.1 (file bootstrap), model $model"
else
  echo "PASS: $ranks ranks in $ranks network namespaces, model $model"
fi
