#!/usr/bin/env bash
set -euo pipefail
build_dir=$1 consumer_src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
prefix="$scratch/prefix"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null

# 1. CMake: find_package(peercm) and peercm::peercm
cmake -S "$consumer_src" -B "$scratch/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$scratch/cmake-build" >/dev/null
out=$(LD_LIBRARY_PATH="$prefix/lib:$prefix/lib64:$prefix/lib/x86_64-linux-gnu" "$scratch/cmake-build/consumer")
echo "cmake consumer: $out"
[[ $out == "peercm "* ]]

# 2. pkg-config
pcdir=$(dirname "$(find "$prefix" -name peercm.pc | head -n1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs peercm)
c++ "$consumer_src/main.cpp" $flags -o "$scratch/pc-consumer"
out=$(LD_LIBRARY_PATH="$(dirname "$pcdir")" "$scratch/pc-consumer")
echo "pkg-config consumer: $out"
[[ $out == "peercm "* ]]
