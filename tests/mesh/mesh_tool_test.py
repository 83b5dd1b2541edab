#!/usr/bin/env python3
"""End-to-end checks of `peercm mesh` (run by CTest, see CMakeLists.txt).

  mesh_tool_test.py --peercm PATH --ranks N --model p2p|static|naive [--transport iwarp|roce]
      Runs `peercm mesh --ranks N --model M --transport T --json` and checks its summary
      (the same over both transports; RoCE connections are told apart by their QPNs):
        every model: exit status 0, every message verified, every pair connected, no
                     errors, no connection seen by one end only, time_to_mesh_us > 0;
        static:      exactly N(N-1)/2 connections, no duplicates, no collisions;
        naive:       between N(N-1)/2 and N(N-1) connections, duplicates = the excess;
        p2p:         exactly N(N-1)/2 connections and no duplicates: the CM resolved every
                     collision (design.md §3). This needs the p2p resolver in the CM.

      With --one-address every rank listens on one random 127/8 address (`--bind`): over RoCE
      the ranks' processes share its UDP port 4791.

  mesh_tool_test.py --peercm PATH --ranks N --model M --crash-rank K [--end-within S]
      Rank K exits abruptly after the start barrier: the job must end quickly with a
      non-zero status and JSON that says it failed (no hang, no stray processes), and
      with --end-within, at most S seconds after the rank's crash (the rank prints the
      CLOCK_MONOTONIC reading it crashed at).
"""
import argparse
import json
import random
import re
import subprocess
import sys
import time

DEADLINE = 7.5  # default seconds for the run (CTest kills at 10; python3 itself may take 2 s to start on a loaded host)


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run(args, extra, ended=None):
    cmd = [args.peercm, "mesh", "--ranks", str(args.ranks), "--model", args.model, "--transport", args.transport,
           "--json", "--timeout", str(args.timeout)] + extra
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.deadline)
    except subprocess.TimeoutExpired:
        fail(f"did not finish within {args.deadline} s: {' '.join(cmd)}")
    elapsed = time.monotonic() - start
    if ended is not None:
        ended.append(time.monotonic())
    sys.stderr.write(proc.stderr)
    print(proc.stdout.strip())
    print(f"exit status {proc.returncode} after {elapsed:.2f} s")
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        fail(f"output is not JSON ({e}): {proc.stdout!r}")
    return proc.returncode, summary, proc.stderr


def check_run(args):
    extra = []
    if args.one_address:
        extra = ["--bind", f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"]
    status, s, _ = run(args, extra)
    n = args.ranks
    pairs = n * (n - 1) // 2
    fields = {"ranks": int, "model": str, "transport": str, "connections": int, "expected_connections": int, "duplicates": int,
              "collisions": int, "rejects": dict, "time_to_mesh_us": int, "messages_verified": int,
              "pairs_connected": int, "asymmetric_connections": int, "errors": list, "ok": bool}
    for key, kind in fields.items():
        if not isinstance(s.get(key), kind) or (kind is int and isinstance(s.get(key), bool)):
            fail(f"JSON field {key} = {s.get(key)!r} is not a {kind.__name__}")
    expect = {"ranks": n, "model": args.model, "transport": args.transport, "expected_connections": pairs, "pairs_connected": pairs,
              "messages_verified": n * (n - 1), "messages_expected": n * (n - 1), "asymmetric_connections": 0}
    for key, value in expect.items():
        if s.get(key) != value:
            fail(f"{key} = {s.get(key)!r}, expected {value!r}")
    for reason in ("application", "refused", "collision", "duplicate", "timeout"):
        if not isinstance(s["rejects"].get(reason), int):
            fail(f"rejects has no count for {reason}")
    if s["time_to_mesh_us"] <= 0:
        fail("time_to_mesh_us is not positive")

    connections, duplicates = s["connections"], s["duplicates"]
    if args.model == "static":
        if connections != pairs or duplicates != 0 or s["collisions"] != 0:
            fail(f"static: {connections} connections, {duplicates} duplicates, {s['collisions']} collisions")
    elif args.model == "naive":
        if not pairs <= connections <= 2 * pairs or duplicates != connections - pairs:
            fail(f"naive: {connections} connections, {duplicates} duplicates")
    else:
        # design.md §3: the CM turns simultaneous connects into exactly one connection.
        if connections != pairs or duplicates != 0:
            fail(f"p2p: {connections} connections and {duplicates} duplicates, expected exactly {pairs} and 0 "
                 f"(is the p2p collision resolver wired into the CM?)")
        if s["rejects"]["application"] != 0:
            fail("p2p: a collision surfaced as an application reject")
    if s["errors"] or not s["ok"]:
        fail(f"errors: {s['errors']}")
    if status != 0:
        fail(f"exit status {status}")


def check_crash(args):
    start = time.monotonic()
    ended = []
    status, s, stderr = run(args, ["--crash-rank", str(args.crash_rank)], ended)
    if status == 0 or s.get("ok") is not False or not s.get("errors"):
        fail(f"a crashed rank went unnoticed: status {status}, {s}")
    if args.end_within is not None:
        crashed = re.search(r"crashing at monotonic ([0-9.]+)", stderr)
        if not crashed:
            fail("the crashing rank did not say when it crashed")
        after = ended[0] - float(crashed.group(1))
        print(f"the job ended {after:.3f} s after rank {args.crash_rank} crashed")
        if after > args.end_within:
            fail(f"the job ended {after:.3f} s after the crash, allowed {args.end_within} s")
    if time.monotonic() - start > args.timeout:
        fail("the job outlived its --timeout")
    # No rank may survive the job.
    leftovers = subprocess.run(["pgrep", "-f", f"--crash-rank {args.crash_rank}"], capture_output=True, text=True)
    if leftovers.stdout.strip():
        time.sleep(0.5)
        leftovers = subprocess.run(["pgrep", "-f", f"--crash-rank {args.crash_rank}"], capture_output=True, text=True)
        if leftovers.stdout.strip():
            fail(f"ranks left running: {leftovers.stdout.split()}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peercm", required=True)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--model", choices=["p2p", "static", "naive"], default="p2p")
    parser.add_argument("--transport", choices=["iwarp", "roce"], default="iwarp")
    parser.add_argument("--timeout", type=float, default=6.0)
    parser.add_argument("--deadline", type=float, default=DEADLINE, help="seconds before the run is killed")
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--one-address", action="store_true",
                        help="every rank on one random 127/8 address (--bind; RoCE: they share its UDP 4791)")
    parser.add_argument("--end-within", type=float, default=None,
                        help="with --crash-rank: seconds from the crash by which the job must have ended")
    args = parser.parse_args()
    if args.crash_rank >= 0:
        check_crash(args)
    else:
        check_run(args)
    print("PASS")


if __name__ == "__main__":
    main()
