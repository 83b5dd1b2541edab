#!/usr/bin/env bash
# Runs tests/dropin_mw/mpi_alltoall.c's program with 4 ranks on this host over one route:
#   tcp           Open MPI's TCP BTL, no peercm (the baseline)
# usage: run_mpi.sh ROUTE PROGRAM
# Each mpirun is bounded by `timeout`; the program's summary line must say mismatches=0,
# and a run with --corrupt must fail with mismatches=1 (the check can fail).
set -euo pipefail
route=$1 program=$2
ranks=4
common=(--allow-run-as-root --oversubscribe -np "$ranks"
        --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo)
case $route in
  tcp) launch=(mpirun "${common[@]}" --mca pml ob1 --mca btl tcp,self) ;;
  *) echo "run_mpi.sh: unknown route $route" >&2; exit 2 ;;
esac

out=$(timeout 90 "${launch[@]}" "$program" 2 2>&1) || { echo "$out"; echo "FAIL: $route run exited non-zero"; exit 1; }
echo "$out" | grep '^mpi_alltoall:'
echo "$out" | grep -q "^mpi_alltoall: ranks=$ranks messages=$((ranks * (ranks - 1) * 16)) .* mismatches=0$"

if out=$(timeout 90 "${launch[@]}" "$program" 1 --corrupt 2>&1); then
  echo "$out"; echo "FAIL: the corrupted run exited 0"; exit 1
fi
echo "$out" | grep '^mpi_alltoall: ranks'
echo "$out" | grep -q "^mpi_alltoall: ranks=$ranks .* mismatches=1$"
echo "PASS: $route"
