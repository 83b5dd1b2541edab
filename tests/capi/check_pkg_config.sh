#!/usr/bin/env bash
# Installs into a scratch prefix and builds a C test of this folder the way the C API's users
# do: cc prog.c $(pkg-config --cflags --libs peercm-rdma). Then runs it.
set -euo pipefail
build_dir=$1 src_dir=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
prefix="$scratch/prefix"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
pcdir=$(dirname "$(find "$prefix" -name peercm-rdma.pc | head -n1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs peercm-rdma)
echo "pkg-config --cflags --libs peercm-rdma: $flags"
cc -std=c11 -Wall -Wextra -Werror -I"$src_dir" "$src_dir/sync_test.c" $flags -o "$scratch/consumer"
LD_LIBRARY_PATH="$(dirname "$pcdir")" "$scratch/consumer"
