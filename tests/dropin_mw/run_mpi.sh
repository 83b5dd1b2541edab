#!/usr/bin/env bash
# Runs tests/dropin_mw/mpi_alltoall.c's program with 4 ranks on this host over one route:
#   tcp           Open MPI's TCP BTL, no peercm (the baseline)
#   ofi-iwarp     Open MPI's cm PML with the ofi MTL on libfabric's verbs;ofi_rxm, under
#                 `peercm exec --transport iwarp`: every rank's messages cross peercm_iw0
#                 (each rank must report the ofi MTL on domain peercm_iw0)
#   ofi-roce      the same under `peercm exec --transport roce`, on peercm_roce0: the four
#                 ranks share the host's interface address (docs/roce-transport.md,
#                 "Several processes on one address")
#   ucx-roce      Open MPI's ucx PML with UCX_TLS=rc on peercm_roce0, under
#                 `peercm exec --transport roce`; each rank's RoCE GID 0 is a 127/8 address
#                 of its own. Skipped (77) without /dev/infiniband/peercm_roce0, which UCX
#                 needs to list the device (run_ucx.sh, docs/drop-in-middleware.md).
# usage: run_mpi.sh ROUTE PROGRAM [PEERCM_TOOL]
# Each mpirun is bounded by `timeout`; the program's summary line must say mismatches=0,
# and a run with --corrupt must fail with mismatches=1 (the check can fail).
set -euo pipefail
route=$1 program=$2 peercm=${3:-}
ranks=4
common=(--allow-run-as-root --oversubscribe -np "$ranks"
        --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo)
case $route in
  tcp) launch=(mpirun "${common[@]}" --mca pml ob1 --mca btl "tcp,self") ;;
  ofi-iwarp | ofi-roce)
    # shellcheck source=tests/dropin_mw/lib.sh
    source "$(dirname "$0")/lib.sh"
    need_ipv4_interface
    transport=${route#ofi-}
    domain=peercm_iw0
    [[ $transport == roce ]] && domain=peercm_roce0
    # The ranks inherit the environment peercm exec set (local launch). The MTL's verbose
    # line names the libfabric domain each rank opened.
    launch=("$peercm" exec --transport "$transport" -- mpirun "${common[@]}" --mca pml cm --mca mtl ofi
            --mca mtl_ofi_provider_include "verbs;ofi_rxm" -x FI_PROVIDER="verbs;ofi_rxm"
            --mca mtl_base_verbose 1)
    ;;
  ucx-roce)
    [[ -c /dev/infiniband/peercm_roce0 ]] ||
      { echo "SKIP: /dev/infiniband/peercm_roce0 is not a character device"; exit 77; }
    export UCX_TLS=rc UCX_NET_DEVICES=peercm_roce0:1 UCX_UD_VERBS_ETH_DGID_CHECK=n
    launch=("$peercm" exec --transport roce -- mpirun "${common[@]}" --mca pml ucx --mca btl self)
    ;;
  *) echo "run_mpi.sh: unknown route $route" >&2; exit 2 ;;
esac

out=$(timeout 90 "${launch[@]}" "$program" 2 2>&1) || { echo "$out"; echo "FAIL: $route run exited non-zero"; exit 1; }
echo "$out" | grep '^mpi_alltoall:'
echo "$out" | grep -q "^mpi_alltoall: ranks=$ranks messages=$((ranks * (ranks - 1) * 16)) .* mismatches=0$"
if [[ $route == ofi-* ]]; then
  on_peercm=$(echo "$out" | grep -c "mtl:ofi:provider: $domain\$" || true)
  echo "ranks whose ofi MTL opened $domain: $on_peercm"
  [[ $on_peercm -eq $ranks ]] || { echo "$out"; echo "FAIL: not every rank ran on $domain"; exit 1; }
fi

[[ $route == tcp ]] || { echo "PASS: $route"; exit 0; }
# The check itself can fail: one wrong byte on purpose (route-independent, so run once).
if out=$(timeout 90 "${launch[@]}" "$program" 1 --corrupt 2>&1); then
  echo "$out"; echo "FAIL: the corrupted run exited 0"; exit 1
fi
echo "$out" | grep '^mpi_alltoall: ranks'
echo "$out" | grep -q "^mpi_alltoall: ranks=$ranks .* mismatches=1$"
echo "PASS: $route"
