#!/usr/bin/env python3
"""Prints a TCP port on 127.0.0.1 that nothing holds now, for a test's server to listen on.

The port comes from below the kernel's ephemeral range (net.ipv4.ip_local_port_range), not
from a bind to port 0: a port from that range may be handed to another process's outgoing
connection between this check and the server's listen, and a suite running in parallel makes
thousands of those. Within 10000 ports below the range a collision needs another test to draw
the same random port in the same second.
"""
import random
import socket


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def main():
    high = ephemeral_low() - 1
    low = max(1024, high - 10000)
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        print(port)
        return
    with socket.socket() as s:  # nothing free below the range: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


main()
