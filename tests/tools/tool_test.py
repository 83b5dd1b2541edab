#!/usr/bin/env python3
"""End-to-end checks of the `peercm` tool (run by CTest, see CMakeLists.txt).

  tool_test.py ping --peercm PATH --op OP --size N --count N --crc on|off
      Starts `peercm ping --server --once` on 127.0.0.1 with port 0 (the server reports
      the port it got on stderr), runs the client against it with --json, and checks that
      both exit with status 0 and that every iteration was verified.

  tool_test.py perf --peercm PATH --op OP --mode MODE --size N --iters N [--pin]
      Runs `peercm perf --loopback ... --json` and checks the JSON and its fields.
"""
import argparse
import json
import math
import random
import re
import subprocess
import sys
import threading
import time

DEADLINE = 8.0  # seconds for a whole test (CTest kills at 10)


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run_ping(args):
    # A RoCE node is an address with one socket on UDP 4791: a random 127/8 one per test.
    host = "127.0.0.1"
    if args.transport == "roce":
        host = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    server = subprocess.Popen(
        [args.peercm, "ping", "--server", "--bind", host, "--port", "0", "--once", "--crc", args.crc,
         "--transport", args.transport],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The server reports "listening on ADDR:PORT" on stderr once it listens.
        found = {}
        lines = []

        def read_stderr():
            for line in server.stderr:
                lines.append(line)
                m = re.search(r"listening on [0-9.]+:(\d+)", line)
                if m and "port" not in found:
                    found["port"] = int(m.group(1))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        start = time.monotonic()
        while "port" not in found:
            if server.poll() is not None or time.monotonic() - start > 3:
                fail(f"the server did not start listening: {''.join(lines)}")
            time.sleep(0.01)
        port = found["port"]

        client_cmd = [args.peercm, "ping", "--client", host, "--port", str(port), "--op", args.op,
                      "--size", str(args.size), "--count", str(args.count), "--crc", args.crc,
                      "--transport", args.transport, "--json"]
        try:
            client = subprocess.run(client_cmd, capture_output=True, text=True,
                                    timeout=DEADLINE - (time.monotonic() - start) - 1)
        except subprocess.TimeoutExpired:
            fail(f"the client did not finish: {' '.join(client_cmd)}")
        sys.stderr.write(client.stderr)
        print(client.stdout.strip())
        if client.returncode != 0:
            fail(f"client exit status {client.returncode}")
        try:
            result = json.loads(client.stdout)
        except json.JSONDecodeError as e:
            fail(f"client output is not JSON ({e}): {client.stdout!r}")
        expected = {"op": args.op, "size": args.size, "count": args.count, "verified": args.count, "errors": 0}
        for key, value in expected.items():
            if result.get(key) != value:
                fail(f"client JSON {key} = {result.get(key)!r}, expected {value!r}")
        if not isinstance(result.get("elapsed_us"), int):
            fail("client JSON has no integer elapsed_us")

        try:
            server_out, _ = server.communicate(timeout=max(0.5, DEADLINE - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            fail("the server did not exit after its client (--once)")
        reader.join(timeout=1)
        print(server_out.strip())
        if server.returncode != 0:
            fail(f"server exit status {server.returncode}: {''.join(lines)}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    print("ok")


def run_perf(args):
    cmd = [args.peercm, "perf", "--loopback", "--op", args.op, "--mode", args.mode, "--size", str(args.size),
           "--iters", str(args.iters), "--transport", args.transport, "--json"] + (["--pin"] if args.pin else []) + \
          (["--warmup", str(args.warmup)] if args.warmup is not None else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        fail(f"did not finish: {' '.join(cmd)}")
    sys.stderr.write(proc.stderr)
    print(proc.stdout.strip())
    if proc.returncode != 0:
        fail(f"exit status {proc.returncode}")
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        fail(f"output is not JSON ({e}): {proc.stdout!r}")
    for key in ("op", "mode", "size", "peercm", "tcp", "ratio", "unit"):
        if key not in result:
            fail(f"JSON field {key} is missing")
    if result["op"] != args.op or result["mode"] != args.mode or result["size"] != args.size:
        fail("op/mode/size do not match the request")
    if result["unit"] != ("us" if args.mode == "lat" else "MB/s"):
        fail(f"unexpected unit {result['unit']!r}")
    for key in ("peercm", "tcp", "ratio"):
        value = result[key]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            fail(f"{key} = {value!r} is not a positive number")
    if not math.isclose(result["ratio"], result["peercm"] / result["tcp"], rel_tol=1e-6):
        fail("ratio is not peercm/tcp")
    # The warm-up is run but not measured: lat min(100, iters/10), bw min(16, iters) unless given.
    default_warmup = min(100, args.iters // 10) if args.mode == "lat" else min(16, args.iters)
    want_warmup = args.warmup if args.warmup is not None else default_warmup
    if result.get("warmup") != want_warmup:
        fail(f"warmup = {result.get('warmup')!r}, expected {want_warmup}")
    if args.mode == "bw":
        for side in ("peercm_detail", "tcp_detail"):
            if result[side]["bytes"] != args.iters * args.size:
                fail(f"{side}.bytes = {result[side]['bytes']}: the measured bytes are not iters x size")
    # --pin in lat mode adds the TCP ping-pong with both ends on one CPU and the one with both
    # ends busy-polling; nothing else has them.
    extra = args.pin and args.mode == "lat"
    for name in ("one_cpu", "spin"):
        for key in (f"tcp_{name}", f"ratio_{name}", f"tcp_{name}_detail"):
            if (key in result) != extra:
                fail(f"JSON field {key} is {'missing' if extra else 'unexpected'}")
        if extra:
            value = result[f"tcp_{name}"]
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                fail(f"tcp_{name} = {value!r} is not a positive number")
            if not math.isclose(result[f"ratio_{name}"], result["peercm"] / value, rel_tol=1e-6):
                fail(f"ratio_{name} is not peercm/tcp_{name}")
            if not math.isclose(result[f"tcp_{name}_detail"]["median"], value, rel_tol=1e-9):
                fail(f"tcp_{name}_detail.median is not tcp_{name}")
    print("ok")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    ping = sub.add_parser("ping")
    ping.add_argument("--peercm", required=True)
    ping.add_argument("--op", required=True, choices=["send", "write", "read"])
    ping.add_argument("--size", type=int, default=64)
    ping.add_argument("--count", type=int, default=20)
    ping.add_argument("--crc", choices=["on", "off"], default="on")
    ping.add_argument("--transport", default="iwarp", choices=["iwarp", "roce"])
    perf = sub.add_parser("perf")
    perf.add_argument("--peercm", required=True)
    perf.add_argument("--op", default="send", choices=["send", "write", "read"])
    perf.add_argument("--mode", default="lat", choices=["lat", "bw"])
    perf.add_argument("--size", type=int, default=8)
    perf.add_argument("--iters", type=int, default=200)
    perf.add_argument("--transport", default="iwarp", choices=["iwarp", "roce"])
    perf.add_argument("--pin", action="store_true")
    perf.add_argument("--warmup", type=int)
    args = parser.parse_args()
    if args.what == "ping":
        run_ping(args)
    else:
        run_perf(args)


if __name__ == "__main__":
    main()
