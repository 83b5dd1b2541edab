#!/usr/bin/env python3
"""End-to-end check of `peercm cmtime` (run by CTest, see CMakeLists.txt).

  cmtime_test.py --peercm PATH --mode client-server|p2p --connections N [--progress thread|inline]
                 [--transport iwarp|roce]

Runs `peercm cmtime --connections N --mode MODE --transport T --json` and checks its exit status and the
JSON: every step timed (total/avg/min/max, consistent), the connect latency and the TCP
baseline present and positive, ratio_connect = peercm avg / tcp avg, the CPU time per
connection of both (positive, ratio_cpu their quotient), and the connection
counts: N established, N CONNECT_REQUESTs on the server in client-server mode, none in p2p
mode where both sides must also see ESTABLISHED on each of their N ids and every pair must
share one connection (design.md §3; a TCP 4-tuple, over RoCE the ends' addresses and QPNs).
"""
import argparse
import json
import math
import subprocess
import sys

STEPS = ("create_id", "resolve_addr", "resolve_route", "create_qp", "connect", "disconnect", "destroy")


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def number(value, what, positive=False):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        fail(f"{what} = {value!r} is not a finite number")
    if value < 0 or (positive and value <= 0):
        fail(f"{what} = {value!r} is not {'positive' if positive else 'non-negative'}")
    return value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peercm", required=True)
    parser.add_argument("--mode", required=True, choices=["client-server", "p2p"])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--progress", choices=["thread", "inline"], default="thread")
    parser.add_argument("--transport", choices=["iwarp", "roce"], default="iwarp")
    parser.add_argument("--deadline", type=float, default=25.0, help="seconds for the whole run")
    args = parser.parse_args()

    cmd = [args.peercm, "cmtime", "--connections", str(args.connections), "--mode", args.mode,
           "--progress", args.progress, "--transport", args.transport, "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.deadline)
    except subprocess.TimeoutExpired:
        fail(f"did not finish in {args.deadline} s: {' '.join(cmd)}")
    sys.stderr.write(proc.stderr)
    print(proc.stdout.strip())
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        fail(f"output is not JSON ({e}); exit status {proc.returncode}")
    if result.get("errors"):
        fail("the run reported errors:\n  " + "\n  ".join(result["errors"]))
    if proc.returncode != 0:
        fail(f"exit status {proc.returncode}")

    n = args.connections
    if result.get("mode") != args.mode or result.get("connections") != n:
        fail(f"mode/connections {result.get('mode')!r}/{result.get('connections')!r} do not match the request")
    if result.get("transport") != args.transport:
        fail(f"transport {result.get('transport')!r}, expected {args.transport!r}")
    if result.get("completed") is not True:
        fail("completed is not true")

    steps = result.get("steps")
    if not isinstance(steps, dict):
        fail("no steps object")
    for step in STEPS:
        s = steps.get(step)
        if not isinstance(s, dict):
            fail(f"step {step} is missing")
        values = {key: number(s.get(key), f"{step}.{key}") for key in ("total_us", "avg_us", "min_us", "max_us")}
        if not values["min_us"] <= values["avg_us"] * (1 + 1e-9) <= values["max_us"] * (1 + 1e-9):
            fail(f"{step}: min/avg/max out of order: {values}")
    for step in ("connect", "disconnect"):
        number(steps[step]["total_us"], f"{step}.total_us", positive=True)
        number(steps[step]["avg_us"], f"{step}.avg_us", positive=True)

    latency = result.get("connect_latency_us") or {}
    lat = {key: number(latency.get(key), f"connect_latency_us.{key}", positive=True) for key in ("avg", "p50", "p99")}
    if lat["p50"] > lat["p99"]:
        fail(f"connect latency p50 {lat['p50']} > p99 {lat['p99']}")
    tcp = (result.get("tcp") or {}).get("connect_exchange_us") or {}
    base = {key: number(tcp.get(key), f"tcp.connect_exchange_us.{key}", positive=True) for key in ("avg", "p50", "p99")}
    if base["p50"] > base["p99"]:
        fail(f"tcp p50 {base['p50']} > p99 {base['p99']}")
    ratio = number(result.get("ratio_connect"), "ratio_connect", positive=True)
    if not math.isclose(ratio, lat["avg"] / base["avg"], rel_tol=1e-6):
        fail(f"ratio_connect {ratio} is not connect latency avg / tcp avg ({lat['avg']} / {base['avg']})")

    cpu = result.get("cpu_us_per_connection") or {}
    cpu_peercm = number(cpu.get("peercm"), "cpu_us_per_connection.peercm", positive=True)
    cpu_tcp = number(cpu.get("tcp"), "cpu_us_per_connection.tcp", positive=True)
    ratio_cpu = number(result.get("ratio_cpu"), "ratio_cpu", positive=True)
    if not math.isclose(ratio_cpu, cpu_peercm / cpu_tcp, rel_tol=1e-6):
        fail(f"ratio_cpu {ratio_cpu} is not peercm / tcp CPU per connection ({cpu_peercm} / {cpu_tcp})")

    if result.get("established") != n:
        fail(f"established = {result.get('established')!r}, expected {n}")
    per_side = result.get("established_per_side") or {}
    if len(per_side) != 2 or any(v != n for v in per_side.values()):
        fail(f"established_per_side = {per_side!r}, expected {n} on each side")
    if result.get("pairs_matched") != n:
        fail(f"pairs_matched = {result.get('pairs_matched')!r}, expected {n}")
    expected_requests = n if args.mode == "client-server" else 0
    if result.get("connect_requests_seen") != expected_requests:
        fail(f"connect_requests_seen = {result.get('connect_requests_seen')!r}, expected {expected_requests}")
    print("ok")


if __name__ == "__main__":
    main()
