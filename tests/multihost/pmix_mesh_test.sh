#!/usr/bin/env bash
# `peercm mesh --bootstrap pmix` under a PMIx launcher (design.md §6):
#
#   pmix_mesh_test.sh PEERCM [--ranks N=4] [--model p2p|static|naive] [--transport iwarp|roce]
#
# runs `mpirun --oversubscribe -np N PEERCM mesh --bootstrap pmix --model M --transport T --json` (with
# --allow-run-as-root when root) and checks rank 0's JSON summary: N(N-1)/2 connections and
# no duplicate (p2p, static), every message verified. Exit 77 (skipped) without mpirun or python3.
set -u
skip() { echo "SKIP: $*"; exit 77; }
die() { echo "FAIL: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: $0 PEERCM [--ranks N] [--model M] [--transport T]"
peercm=$1
shift
ranks=4
model=p2p
transport=iwarp
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found"
command -v python3 >/dev/null 2>&1 || skip "python3 not found (checks the JSON)"
root=()
[[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)

out=$(mktemp /tmp/peercm-pmix-mesh.XXXXXX)
trap 'rm -f "$out"' EXIT
start=$(date +%s.%N)
# Under ASan, LeakSanitizer must not blame the PMIx runtime's own allocations on us.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp"
timeout 25 mpirun "${root[@]}" --oversubscribe -x LSAN_OPTIONS -np "$ranks" \
  "$peercm" mesh --bootstrap pmix --model "$model" --transport "$transport" --timeout 15 --json -v >"$out"
status=$?
cat "$out"
python3 -c 'import sys, time; print(f"mpirun took {time.time() - float(sys.argv[1]):.2f} s")' "$start"
[[ $status -eq 0 ]] || die "mpirun exit status $status"

python3 - "$out" "$ranks" "$model" "$transport" <<'PY'
import json, sys
path, n, model, transport = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lines = [l for l in open(path).read().splitlines() if l.startswith("{")]
if len(lines) != 1:
    print(f"FAIL: expected one JSON summary (rank 0), got {len(lines)} lines", file=sys.stderr)
    sys.exit(1)
s = json.loads(lines[0])
pairs = n * (n - 1) // 2
expect = {"ranks": n, "model": model, "transport": transport, "bootstrap": "pmix", "expected_connections": pairs,
          "pairs_connected": pairs, "messages_verified": n * (n - 1), "asymmetric_connections": 0, "ok": True}
if model != "naive":
    expect.update({"connections": pairs, "duplicates": 0})
bad = [f"{k} = {s.get(k)!r}, expected {v!r}" for k, v in expect.items() if s.get(k) != v]
for b in bad:
    print(f"FAIL: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
[[ $? -eq 0 ]] || exit 1
echo "PASS: $ranks ranks under mpirun (PMIx bootstrap), model $model"
