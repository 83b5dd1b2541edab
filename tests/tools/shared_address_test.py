#!/usr/bin/env python3
"""Client and server processes on one RoCE address (run by CTest, see CMakeLists.txt).

  shared_address_test.py --peercm PATH

Starts `peercm ping --server --transport roce` on a random 127/8 address (it serves clients one
after another), then runs clients one by one, each its own process bound to the same address
(`--bind`), so that all share its UDP port 4791 (docs/roce-transport.md, "Several processes on
one address"): a send, a write and a read client of 65539 bytes x 100, each verified, then a
send client again. Each client that ends frees its slot, and the next one joins the address
afterwards and connects. Checks: every client exits 0 with every iteration verified; the
server reports each client at the shared address with 0 errors, and no error; once the
clients are gone, the only slot name the address has is the server's (`ss -xl`: the kernel
dropped every exited client's).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

DEADLINE = 25.0


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def slot_names(host):
    out = subprocess.run(["ss", "-xlH"], capture_output=True, text=True).stdout
    return sorted(set(re.findall(rf"@peercm-roce/{os.getuid()}/{re.escape(host)}/slot/\d+", out)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peercm", required=True)
    args = parser.parse_args()
    host = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    start = time.monotonic()
    # Line-buffered stdout: its reports are read as the server writes them.
    # stdbuf works by preloading a library, ahead of the ASan runtime in the sanitizer build,
    # whose link-order check would refuse to start.
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
    server = subprocess.Popen(["stdbuf", "-oL", args.peercm, "ping", "--server", "--bind", host, "--port", "0", "--transport", "roce"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        found, lines = {}, []

        def read_stderr():
            for line in server.stderr:
                lines.append(line)
                m = re.search(r"listening on [0-9.]+:(\d+)", line)
                if m and "port" not in found:
                    found["port"] = int(m.group(1))

        reports = []

        def read_stdout():
            for line in server.stdout:
                reports.append(line)

        threading.Thread(target=read_stderr, daemon=True).start()
        threading.Thread(target=read_stdout, daemon=True).start()
        while "port" not in found:
            if server.poll() is not None or time.monotonic() - start > 3:
                fail(f"the server did not start listening: {''.join(lines)}")
            time.sleep(0.01)
        ops = ["send", "write", "read", "send"]
        for op in ops:
            cmd = [args.peercm, "ping", "--client", host, "--bind", host, "--port", str(found["port"]), "--op", op,
                   "--size", "65539", "--count", "100", "--transport", "roce", "--json"]
            try:
                client = subprocess.run(cmd, capture_output=True, text=True,
                                        timeout=max(1.0, DEADLINE - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                fail(f"the client did not finish: {' '.join(cmd)}")
            sys.stderr.write(client.stderr)
            print(client.stdout.strip())
            if client.returncode != 0:
                fail(f"{op} client exit status {client.returncode}")
            result = json.loads(client.stdout)
            if result.get("verified") != 100 or result.get("errors") != 0:
                fail(f"{op} client: {result}")
        # The server reports a client once it has seen it disconnect.
        while sum("server: " in line for line in reports) < len(ops) and time.monotonic() - start < DEADLINE:
            time.sleep(0.02)
        names = slot_names(host)
        print(f"slot names at {host}: {names}")
        if len(names) != 1:
            fail(f"expected only the server's slot name at {host}, found {names}")
    finally:
        # It serves until stopped.
        server.terminate()
        try:
            server.wait(timeout=3)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    time.sleep(0.1)  # the readers take the last lines
    text = "".join(reports) + "".join(lines)
    print(text.strip())
    seen = re.findall(rf"server: {re.escape(host)}:\d+ op (\w+) size 65539 count 100: 0 errors", text)
    if seen != ops:
        fail(f"server reported {seen}, expected {ops} from clients at {host}")
    if "error:" in text:
        fail("the server reported an error")
    print("PASS")


if __name__ == "__main__":
    main()
