#!/usr/bin/env python3
"""Parser and report generator of bench/side_by_side.sh.

  side_by_side_report.py emit RAW_CSV KIND LOG --rep R --seq S --group G --size B --contender C
      Parses one tool's output (KIND: peercm, sockperf, iperf3, fabric, ucx, cmtime, mesh, mpi)
      and appends its samples to RAW_CSV. Exit 1 (and nothing appended) when the output
      has no result.
  side_by_side_report.py parse DIR
      The same for every line of DIR/index.tsv (rep, seq, kind, log, group, size, contender,
      keep) at once: writes DIR/raw.csv and DIR/dropped.txt (samples without a result).
  side_by_side_report.py syscalls --label L --messages N [--split] STRACE_LOG...
      Markdown rows of system calls per message from `strace -f -ttt` logs (bench/side_by_side.sh
      --profile).
  side_by_side_report.py report DIR
      Runs `parse DIR` when DIR/index.tsv exists, then reads DIR/raw.csv and DIR/machine.txt, writes DIR/results.md, DIR/plot-*.dat,
      DIR/plot.gp and renders DIR/plot.png with gnuplot.

Units, everywhere: latency is ONE-WAY (half the round trip), in microseconds; bandwidth is
GB/s (10^9 bytes per second); connection setup in microseconds. Every tool's own figure is
converted: peercm perf (median RTT/2, MB/s = 10^6 B/s), sockperf (one-way by default),
fi_pingpong (usec/xfer = elapsed / iterations / 2, a mean), ucx_perftest (half round trip;
MB/s there is MiB/s), iperf3 (bits per second).
"""

import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys

FIELDS = ["rep", "seq", "group", "size", "contender", "stat", "value", "unit", "note"]

# Display order and labels of the contenders.
CONTENDERS = [
    ("tcp", "raw TCP (peercm perf in-process baseline)"),
    ("tcp-1cpu", "raw TCP, both ends on one CPU (peercm perf --pin, loopback only)"),
    ("tcp-spin", "raw TCP, both ends busy-polling recv() on their own CPUs (peercm perf --pin): the polling floor"),
    ("sockperf", "raw TCP, sockperf ping-pong"),
    ("iperf3", "raw TCP, iperf3"),
    ("libfabric", "libfabric tcp (fi_pingpong -e msg)"),
    ("ucx-lo", "UCX tcp, lo only (UCX_NET_DEVICES=lo)"),
    ("ucx-mr", "UCX tcp, default devices (multi-rail, reference)"),
    ("peercm-send-off", "peercm Send, CRC off"),
    ("peercm-send-on", "peercm Send, CRC on"),
    ("peercm-write-off", "peercm RDMA Write, CRC off"),
    ("peercm-write-on", "peercm RDMA Write, CRC on"),
    ("peercm-send-off-inline", "peercm Send, CRC off, inline progress"),
]
LABEL = dict(CONTENDERS)
SHORT = {
    "tcp": "TCP",
    "tcp-1cpu": "TCP 1 CPU",
    "tcp-spin": "TCP polling",
    "sockperf": "sockperf",
    "iperf3": "iperf3",
    "libfabric": "libfabric",
    "ucx-lo": "UCX lo",
    "ucx-mr": "UCX multi-rail",
    "peercm-send-off": "peercm send",
    "peercm-send-on": "peercm send+CRC",
    "peercm-write-off": "peercm write",
    "peercm-write-on": "peercm write+CRC",
    "peercm-send-off-inline": "peercm send inline",
}


def size_label(size):
    size = int(size)
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    if size >= 1 << 10 and size % (1 << 10) == 0:
        return f"{size >> 10} KiB"
    return f"{size} B"


# ---------------------------------------------------------------------------------------
# Parsers: each returns a list of (contender, stat, value, unit, note).
# ---------------------------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def last_json_object(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    # Pretty-printed JSON: the whole text.
    return json.loads(text)


def parse_peercm(text, contender, size):
    d = last_json_object(text)
    if d["mode"] == "lat":
        pd, td = d["peercm_detail"], d["tcp_detail"]
        out = [
            (contender, "p50_us", pd["median"], "us", ""),
            (contender, "mean_us", pd["average"], "us", ""),
            (contender, "paired_ratio_p50", d["ratio"], "", "peercm/tcp of this invocation"),
            (contender, "paired_ratio_mean", pd["average"] / td["average"], "", ""),
            ("tcp", "p50_us", td["median"], "us", f"baseline of {contender}"),
            ("tcp", "mean_us", td["average"], "us", f"baseline of {contender}"),
        ]
        if "tcp_one_cpu_detail" in d:
            od = d["tcp_one_cpu_detail"]
            out += [("tcp-1cpu", "p50_us", od["median"], "us", f"baseline of {contender}"),
                    ("tcp-1cpu", "mean_us", od["average"], "us", f"baseline of {contender}")]
        if "tcp_spin_detail" in d:
            sd = d["tcp_spin_detail"]
            out += [("tcp-spin", "p50_us", sd["median"], "us", f"baseline of {contender}"),
                    ("tcp-spin", "mean_us", sd["average"], "us", f"baseline of {contender}")]
    else:
        out = [
            (contender, "GBps", d["peercm"] / 1000.0, "GB/s", ""),
            (contender, "paired_ratio_bw", d["ratio"], "", "peercm/tcp of this invocation"),
            ("tcp", "GBps", d["tcp"] / 1000.0, "GB/s", f"baseline of {contender}"),
        ]
    return out


def parse_sockperf(text, contender, size):
    text = ANSI.sub("", text)
    p50 = re.search(r"percentile 50\.000 =\s*([0-9.]+)", text)
    avg = re.search(r"avg-latency=([0-9.]+)", text)
    msg = re.search(r"-m\s+(\d+)|msg-size[= ](\d+)", text)
    if not p50 or not avg:
        raise ValueError("no 'percentile 50.000' / 'avg-latency' in sockperf output")
    note = ""
    if msg:
        note = f"message {msg.group(1) or msg.group(2)} B"
    return [
        (contender, "p50_us", float(p50.group(1)), "us", note),
        (contender, "mean_us", float(avg.group(1)), "us", note),
    ]


def parse_iperf3(text, contender, size):
    d = json.loads(text)
    if "error" in d:
        raise ValueError("iperf3: " + d["error"])
    bps = d["end"]["sum_received"]["bits_per_second"]
    return [(contender, "GBps", bps / 8e9, "GB/s", "receiver side")]


FI_ROW = re.compile(
    r"^\s*(\S+)\s+(\S+)\s+([=+\-]\S+)\s+(\S+)\s+([0-9.]+)s\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


def parse_fi(text, contender, size):
    rows = [FI_ROW.match(l) for l in text.splitlines()]
    rows = [r for r in rows if r]
    if not rows:
        raise ValueError("no result row in fi_pingpong output")
    r = rows[-1]
    usec_per_xfer = float(r.group(7))  # elapsed / iterations / 2: mean one-way
    if usec_per_xfer <= 0:
        raise ValueError("fi_pingpong reported 0 usec/xfer")
    return [(contender, "mean_us", usec_per_xfer, "us", "mean (elapsed/iters/2); no median")]


def parse_ucx(text, contender, size):
    header, row = None, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("iterations,"):
            header = line.split(",")
            continue
        if header and re.match(r"^\s*\d", line):
            vals = [v.strip() for v in line.split(",")]
            if len(vals) >= len(header):
                row = dict(zip(header, vals))
    if row is None:
        raise ValueError("no CSV result in ucx_perftest output (-f -v)")
    p50_key = next(k for k in header if "percentile" in k or k == "typical_lat")
    lat_p50, lat_overall = float(row[p50_key]), float(row["overall_lat"])
    bw_mib = float(row["overall_bw"])
    return [
        (contender, "p50_us", lat_p50, "us", ""),
        (contender, "mean_us", lat_overall, "us", ""),
        (contender, "GBps", bw_mib * 1048576 / 1e9, "GB/s", ""),
    ]


def parse_cmtime(text, contender, size):
    d = last_json_object(text)
    if d.get("errors"):
        raise ValueError("cmtime errors: " + "; ".join(map(str, d["errors"]))[:300])
    tcp = d["tcp"]["connect_exchange_us"]
    return [
        (contender, "connect_avg_us", d["connect_latency_us"]["avg"], "us", ""),
        (contender, "connect_p50_us", d["connect_latency_us"]["p50"], "us", ""),
        (contender, "paired_ratio_connect", d["ratio_connect"], "", "peercm/tcp avg of this invocation"),
        (contender, "connect_total_us", d["steps"]["connect"]["total_us"], "us", ""),
        ("tcp-" + contender, "connect_avg_us", tcp["avg"], "us", "N connects at once + 8 B exchange"),
        ("tcp-" + contender, "connect_p50_us", tcp["p50"], "us", ""),
        ("tcp-" + contender, "connect_total_us", d["tcp"]["total_us"], "us", ""),
    ]


def parse_mesh(text, contender, size):
    d = last_json_object(text)
    if not d.get("ok") or d.get("time_to_mesh_us") is None:
        raise ValueError("mesh not ok: " + json.dumps(d.get("errors"))[:300])
    return [(contender, "time_us", d["time_to_mesh_us"], "us",
             f"{d['connections']} connections, {d['duplicates']} duplicates")]


def parse_mpi(text, contender, size):
    d = last_json_object(text)
    if not d.get("verified"):
        raise ValueError("MPI all-to-all data not verified")
    return [
        (contender, "time_us", d["first_alltoall_us"], "us", ""),
        (contender, "second_us", d["second_alltoall_us"], "us", "connected"),
    ]


PARSERS = {
    "peercm": parse_peercm,
    "sockperf": parse_sockperf,
    "iperf3": parse_iperf3,
    "fabric": parse_fi,
    "ucx": parse_ucx,
    "cmtime": parse_cmtime,
    "mesh": parse_mesh,
    "mpi": parse_mpi,
}


def parse_one(kind, log, contender, size, keep):
    """Samples of one tool output, or raises."""
    with open(log, errors="replace") as f:
        text = f.read()
    samples = PARSERS[kind](text, contender, int(size))
    if keep:
        keep = set(keep.split(","))
        samples = [s for s in samples if s[1] in keep or s[1].startswith("paired_")]
    return [s for s in samples if s[2] is not None and math.isfinite(float(s[2]))]


def write_samples(raw, rows):
    new = not os.path.exists(raw) or os.path.getsize(raw) == 0
    with open(raw, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(FIELDS)
        for rep, seq, group, size, (contender, stat, value, unit, note) in rows:
            w.writerow([rep, seq, group, size, contender, stat, f"{float(value):.6g}", unit, note])


def cmd_emit(a):
    try:
        samples = parse_one(a.kind, a.log, a.contender, a.size, a.keep)
    except Exception as e:  # noqa: BLE001 - any parse failure drops the sample
        print(f"side_by_side: cannot parse {a.log} ({a.kind}): {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    write_samples(a.raw, [(a.rep, a.seq, a.group, a.size, s) for s in samples])
    return 0


def cmd_parse(dirpath):
    raw = os.path.join(dirpath, "raw.csv")
    if os.path.exists(raw):
        os.remove(raw)
    rows, dropped = [], []
    with open(os.path.join(dirpath, "index.tsv"), newline="") as f:
        for r in csv.DictReader(f, delimiter="\t"):
            try:
                samples = parse_one(r["kind"], r["log"], r["contender"], r["size"], r["keep"])
            except Exception as e:  # noqa: BLE001 - any parse failure drops the sample
                dropped.append(f"rep {r['rep']} {r['contender']} {r['group']} {r['size']}: "
                               f"{type(e).__name__}: {e} ({os.path.basename(r['log'])})")
                continue
            rows += [(r["rep"], r["seq"], r["group"], r["size"], s) for s in samples]
    write_samples(raw, rows)
    with open(os.path.join(dirpath, "dropped.txt"), "w") as f:
        f.write("".join(d + "\n" for d in dropped))
    for d in dropped:
        print(f"side_by_side: sample dropped: {d}", file=sys.stderr)
    return dropped


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


class Data:
    def __init__(self, path):
        self.samples = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                key = (row["group"], int(row["size"]), row["contender"], row["stat"])
                self.samples.setdefault(key, []).append(float(row["value"]))

    def values(self, group, size, contender, stat):
        return self.samples.get((group, size, contender, stat), [])

    def median(self, group, size, contender, stat):
        v = self.values(group, size, contender, stat)
        return statistics.median(v) if v else None

    def sizes(self, group):
        return sorted({k[1] for k in self.samples if k[0] == group})

    def contenders(self, group, size):
        present = {k[2] for k in self.samples if k[0] == group and k[1] == size}
        return [c for c, _ in CONTENDERS if c in present]


def fmt(x, digits=3):
    if x is None:
        return "—"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


# The targets live in bench/targets.json ("side_by_side"), beside those of the other benches.
TARGETS = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.json")))["side_by_side"]


def check(value, op, target):
    if value is None:
        return "n/a"
    ok = value <= target if op == "<=" else value >= target
    return f"{'PASS' if ok else 'FAIL'} ({op} {target:g})"


def spread(values):
    if not values:
        return ""
    return f"{fmt(min(values))}–{fmt(max(values))}" if len(values) > 1 else fmt(values[0])


def report(dirpath):
    dropped = cmd_parse(dirpath) if os.path.exists(os.path.join(dirpath, "index.tsv")) else []
    data = Data(os.path.join(dirpath, "raw.csv"))
    machine = ""
    mpath = os.path.join(dirpath, "machine.txt")
    if os.path.exists(mpath):
        with open(mpath) as f:
            machine = f.read().strip()
    md = []
    targets = []  # (figure, measured, check)
    plot_rows = {"lat": {}, "bw": {}, "pp": {}}

    md.append("# Side-by-side: peercm, libfabric tcp, UCX tcp and raw TCP on loopback\n")
    md.append(machine + "\n" if machine else "")
    md.append(
        "Every figure is the **median over the repetitions** of one run of the suite; the "
        "contenders ran interleaved (the order rotates every repetition). Latency is **one-way "
        "(half the round trip), µs**; bandwidth is **GB/s (10^9 B/s)**. \"ratio to TCP\" divides "
        "by the median of the raw TCP baseline that `peercm perf --loopback` measured in the same "
        "run (same pattern, blocking sockets, TCP_NODELAY; pinned like peercm's ends unless --no-pin); for peercm, \"paired\" is the median "
        "of the per-invocation peercm/TCP ratios (both halves of one invocation ran back to back). "
        "The spread column is min–max over the repetitions.\n")

    # ---- summary -------------------------------------------------------------------------
    md.append("## Summary: median (ratio to raw TCP of the same run)\n")
    md.append("Latency: p50 of each run (libfabric: mean, the only figure fi_pingpong gives), one-way. "
              "Ping-pong throughput: size / mean one-way latency. Ratios here are ratios of medians; "
              "the target checks below use peercm's paired ratios.\n")
    cols = [("lat", 8, "p50_us", "latency 8 B, µs"), ("lat", 4096, "p50_us", "latency 4 KiB, µs"),
            ("bw", 65536, "GBps", "stream 64 KiB, GB/s"), ("bw", 1048576, "GBps", "stream 1 MiB, GB/s"),
            ("pp", 65536, "pp", "ping-pong 64 KiB, GB/s"), ("pp", 1048576, "pp", "ping-pong 1 MiB, GB/s")]
    md.append("| contender | " + " | ".join(c[3] for c in cols) + " |")
    md.append("|---" * (len(cols) + 1) + "|")

    def cell(group, size, stat, c):
        if stat == "pp":
            m, t = data.median(group, size, c, "mean_us"), data.median(group, size, "tcp", "mean_us")
            v, ref, mark = (size / m / 1000 if m else None), (size / t / 1000 if t else None), ""
        else:
            v, ref, mark = data.median(group, size, c, stat), data.median(group, size, "tcp", stat), ""
            if v is None and stat == "p50_us":  # libfabric: only a mean
                v, ref, mark = data.median(group, size, c, "mean_us"), data.median(group, size, "tcp", "mean_us"), " (mean)"
        return "—" if v is None else f"{fmt(v)}{mark} ({fmt(ratio(v, ref))})"

    for c, _ in CONTENDERS:
        if not any(data.values(g, z, c, stat) for g, z, _, _ in cols for stat in ("p50_us", "mean_us", "GBps")):
            continue
        md.append(f"| {LABEL[c]} | " + " | ".join(cell(g, z, st, c) for g, z, st, _ in cols) + " |")
    md.append("")

    # ---- latency -------------------------------------------------------------------------
    md.append("## Latency, one-way, µs (8 B and 4 KiB ping-pong)\n")
    md.append("| contender | size | median p50 | spread p50 | median mean | ratio to TCP (p50) | "
              "ratio to TCP (mean) | paired ratio (p50) | vs libfabric (mean) | vs UCX lo (p50) | targets |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in data.sizes("lat"):
        tcp_p50 = data.median("lat", size, "tcp", "p50_us")
        tcp_mean = data.median("lat", size, "tcp", "mean_us")
        fi_mean = data.median("lat", size, "libfabric", "mean_us")
        ucx_p50 = data.median("lat", size, "ucx-lo", "p50_us")
        for c in data.contenders("lat", size):
            p50 = data.median("lat", size, c, "p50_us")
            mean = data.median("lat", size, c, "mean_us")
            paired = data.median("lat", size, c, "paired_ratio_p50")
            r_tcp = ratio(p50, tcp_p50)
            r_tcp_mean = ratio(mean, tcp_mean)
            r_fi = ratio(mean, fi_mean) if c.startswith("peercm") else None
            r_ucx = ratio(p50, ucx_p50) if c.startswith("peercm") else None
            checks = ""
            if c.startswith("peercm"):
                primary = paired if paired is not None else r_tcp
                cks = [f"TCP {check(primary, '<=', TARGETS['latency_vs_tcp_max'])}",
                       f"libfabric {check(r_fi, '<=', TARGETS['latency_vs_libfabric_max'])}",
                       f"UCX {check(r_ucx, '<=', TARGETS['latency_vs_ucx_max'])}"]
                checks = "; ".join(cks)
                for name, val, op, tgt in (("raw TCP (paired, p50)", primary, "<=", TARGETS["latency_vs_tcp_max"]),
                                           ("libfabric tcp (mean)", r_fi, "<=", TARGETS["latency_vs_libfabric_max"]),
                                           ("UCX tcp lo (p50)", r_ucx, "<=", TARGETS["latency_vs_ucx_max"])):
                    targets.append((f"{LABEL[c]}, latency {size_label(size)} vs {name}", val,
                                    check(val, op, tgt)))
            label = LABEL[c]
            if c == "sockperf" and size < 14:
                label += " (14 B: sockperf's minimum)"
            md.append(f"| {label} | {size_label(size)} | {fmt(p50)} | "
                      f"{spread(data.values('lat', size, c, 'p50_us'))} | {fmt(mean)} | {fmt(r_tcp)} | "
                      f"{fmt(r_tcp_mean)} | {fmt(paired)} | {fmt(r_fi)} | {fmt(r_ucx)} | {checks} |")
            # plot: ratio to TCP, p50 where there is one, else the mean ratio
            plot_rows["lat"].setdefault(c, {})[size] = r_tcp if r_tcp is not None else r_tcp_mean
    md.append("")
    md.append("libfabric's `fi_pingpong` prints only elapsed/iterations/2 (a mean), so its p50 is "
              "empty and peercm is compared with it on the mean. Busy-polling contenders (peercm, "
              "libfabric, UCX) on this 2-core shared machine are bimodal: the mean is dominated by "
              "the iterations in which the two pollers shared a core.\n")

    # ---- streaming bandwidth ---------------------------------------------------------------
    md.append("## Streaming bandwidth, GB/s (64 KiB and 1 MiB messages)\n")
    md.append("| contender | size | median | spread | ratio to TCP | paired ratio | vs UCX lo | targets |")
    md.append("|---|---|---|---|---|---|---|---|")
    for size in data.sizes("bw"):
        tcp_bw = data.median("bw", size, "tcp", "GBps")
        ucx_bw = data.median("bw", size, "ucx-lo", "GBps")
        for c in data.contenders("bw", size):
            bw = data.median("bw", size, c, "GBps")
            paired = data.median("bw", size, c, "paired_ratio_bw")
            r_tcp = ratio(bw, tcp_bw)
            r_ucx = ratio(bw, ucx_bw) if c.startswith("peercm") else None
            checks = ""
            if c.startswith("peercm"):
                primary = paired if paired is not None else r_tcp
                to_tcp, to_ucx = TARGETS["bandwidth_vs_tcp_min"], TARGETS["bandwidth_vs_ucx_min"]
                checks = f"TCP {check(primary, '>=', to_tcp)}; UCX {check(r_ucx, '>=', to_ucx)}"
                targets.append((f"{LABEL[c]}, bandwidth {size_label(size)} vs raw TCP (paired)", primary,
                                check(primary, ">=", to_tcp)))
                targets.append((f"{LABEL[c]}, bandwidth {size_label(size)} vs UCX tcp lo", r_ucx,
                                check(r_ucx, ">=", to_ucx)))
            md.append(f"| {LABEL[c]} | {size_label(size)} | {fmt(bw)} | "
                      f"{spread(data.values('bw', size, c, 'GBps'))} | {fmt(r_tcp)} | {fmt(paired)} | "
                      f"{fmt(r_ucx)} | {checks} |")
            plot_rows["bw"].setdefault(c, {})[size] = r_tcp
    md.append("")
    md.append("libfabric has no streaming row: Debian's libfabric-bin ships only `fi_pingpong` "
              "(fabtests' `fi_msg_bw` is not packaged), so libfabric's bandwidth is the ping-pong "
              "throughput below, and peercm is compared with it on the same pattern.\n")

    # ---- ping-pong throughput -------------------------------------------------------------
    md.append("## Ping-pong throughput, GB/s (64 KiB and 1 MiB; size / mean one-way latency)\n")
    md.append("| contender | size | median one-way p50, µs | median one-way mean, µs | throughput GB/s | "
              "ratio to TCP | vs libfabric | vs UCX lo | targets |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    for size in data.sizes("pp"):
        tcp_mean = data.median("pp", size, "tcp", "mean_us")
        fi_mean = data.median("pp", size, "libfabric", "mean_us")
        ucx_mean = data.median("pp", size, "ucx-lo", "mean_us")
        tput = (lambda m: size / m / 1000.0 if m else None)
        for c in data.contenders("pp", size):
            p50 = data.median("pp", size, c, "p50_us")
            mean = data.median("pp", size, c, "mean_us")
            t = tput(mean)
            r_tcp = ratio(t, tput(tcp_mean))
            r_fi = ratio(t, tput(fi_mean)) if c.startswith("peercm") else None
            r_ucx = ratio(t, tput(ucx_mean)) if c.startswith("peercm") else None
            checks = ""
            if c.startswith("peercm"):
                to_fi = TARGETS["pingpong_throughput_vs_libfabric_min"]
                checks = f"libfabric {check(r_fi, '>=', to_fi)}"
                targets.append((f"{LABEL[c]}, ping-pong throughput {size_label(size)} vs libfabric tcp",
                                r_fi, check(r_fi, ">=", to_fi)))
            md.append(f"| {LABEL[c]} | {size_label(size)} | {fmt(p50)} | {fmt(mean)} | {fmt(t)} | "
                      f"{fmt(r_tcp)} | {fmt(r_fi)} | {fmt(r_ucx)} | {checks} |")
            plot_rows["pp"].setdefault(c, {})[size] = r_tcp
    md.append("")

    # ---- connection setup ------------------------------------------------------------------
    md.append("## Connection setup, µs\n")
    md.append("| figure | median | spread | baseline | baseline median | ratio (of medians) | paired ratio |")
    md.append("|---|---|---|---|---|---|---|")
    for c, desc in (("cmtime-cs", "client-server"), ("cmtime-p2p", "p2p (simultaneous)")):
        for size in data.sizes("setup"):
            v = data.median("setup", size, c, "connect_avg_us")
            if v is None:
                continue
            b = data.median("setup", size, "tcp-" + c, "connect_avg_us")
            paired = data.median("setup", size, c, "paired_ratio_connect")
            md.append(f"| `peercm cmtime --mode {c.split('-', 1)[1].replace('cs', 'client-server')} "
                      f"--connections {size}`: connect() to ESTABLISHED, avg per connection ({desc}) | "
                      f"{fmt(v)} | {spread(data.values('setup', size, c, 'connect_avg_us'))} | "
                      f"TCP: {size} non-blocking connects at once + 8 B request/reply | {fmt(b)} | "
                      f"{fmt(ratio(v, b))} | {fmt(paired)} |")
            if c == "cmtime-p2p":
                targets.append((f"cmtime p2p, {size} connections: connect latency vs TCP (docs/performance.md)",
                                paired, check(paired, "<=", TARGETS["cmtime_p2p_connect_vs_tcp_max"])))
    for size in data.sizes("mesh"):
        mesh = data.median("mesh", size, "peercm-mesh", "time_us")
        for c, desc in (("mpi-init", "from the end of MPI_Init (out-of-band fence): all connections"),
                        ("mpi-barrier", "after an MPI_Barrier (which opened log2 N connections per rank)")):
            mpi = data.median("mesh", size, c, "time_us")
            if mpi is None:
                continue
            md.append(f"| `peercm mesh --ranks {size} --model p2p --size 8`: time to mesh vs Open MPI "
                      f"TCP first `MPI_Alltoall` of 8 B, {desc} | {fmt(mesh)} | "
                      f"{spread(data.values('mesh', size, 'peercm-mesh', 'time_us'))} | "
                      f"Open MPI {c} | {fmt(mpi)} ({spread(data.values('mesh', size, c, 'time_us'))}) | "
                      f"{fmt(ratio(mesh, mpi))} | — |")
        second = data.median("mesh", size, "mpi-init", "second_us")
        if second is not None:
            md.append(f"| Open MPI TCP second `MPI_Alltoall` (connections up), {size} ranks | {fmt(second)} | "
                      f"{spread(data.values('mesh', size, 'mpi-init', 'second_us'))} | — | — | — | — |")
    md.append("")

    # ---- targets ------------------------------------------------------------------------
    md.append("## Targets (issue: latency <= libfabric, <= UCX, <= 1.15x TCP; bandwidth >= libfabric, "
              ">= UCX, >= 0.9x TCP)\n")
    md.append("| target | measured ratio | result |")
    md.append("|---|---|---|")
    for name, val, res in targets:
        md.append(f"| {name} | {fmt(val)} | {res} |")
    passed = sum(1 for _, _, r in targets if r.startswith("PASS"))
    md.append(f"\n{passed} of {len(targets)} target checks pass.\n")
    md.append("The checks against UCX and libfabric compare medians of samples taken minutes apart, on a host "
              "whose speed moves between minutes; where one misses by a few per cent, `bench/paired_ratios.sh "
              "--against ucx|libfabric` decides in order-alternating pairs, and its `--null` run (the other "
              "stack against itself) shows how far noise alone moves such a ratio.\n")
    md.append("![ratios to raw TCP](plot.png)\n")
    if dropped:
        md.append(f"{len(dropped)} samples had no result (a tool failed or timed out) and are not in "
                  "the medians:\n")
        md.extend(f"- {d}" for d in dropped)
        md.append("")
    ppath = os.path.join(dirpath, "profile.md")
    if os.path.exists(ppath):
        md.append("## System calls per message (`--profile`: strace -f, one run each)\n")
        md.append("Under strace every call is slower, so the counts of polling calls (epoll_wait, poll) "
                  "are inflated against a free run; sends, receives and futex wake-ups are not.\n")
        with open(ppath) as f:
            md.append(f.read())

    with open(os.path.join(dirpath, "results.md"), "w") as f:
        f.write("\n".join(md))
    write_plot(dirpath, plot_rows)
    print(os.path.join(dirpath, "results.md"))
    return 0


def write_plot(dirpath, rows):
    panels = [
        ("lat", "Latency, one-way (p50; libfabric: mean): ratio to raw TCP (lower is better)", 1.15),
        ("bw", "Streaming bandwidth: ratio to raw TCP (higher is better)", 0.9),
        ("pp", "Ping-pong throughput (size/mean one-way): ratio to raw TCP (higher is better)", None),
    ]
    gp = [
        "set terminal pngcairo size 1300,1500 font 'DejaVu Sans,11'",
        f"set output '{os.path.join(dirpath, 'plot.png')}'",
        "set multiplot layout 3,1",
        "set style data histograms",
        "set style histogram clustered gap 1",
        "set style fill solid 0.85 border -1",
        "set boxwidth 0.9",
        "set datafile missing '?'",
        "set key top left",
        "set grid ytics",
        "set xtics rotate by -25 nomirror",
        "set logscale y",
        "set ylabel 'ratio to raw TCP (log scale)'",
        "set format y '%g'",
    ]
    for name, title, target in panels:
        r = rows[name]
        if not r:
            continue
        sizes = sorted({s for v in r.values() for s in v})
        dat = os.path.join(dirpath, f"plot-{name}.dat")
        with open(dat, "w") as f:
            f.write("contender " + " ".join(f'"{size_label(s)}"' for s in sizes) + "\n")
            for c, _ in CONTENDERS:
                if c not in r or c == "tcp":
                    continue
                vals = [r[c].get(s) for s in sizes]
                f.write(f'"{SHORT[c]}" ' + " ".join(fmt(v, 4) if v is not None else "?" for v in vals) + "\n")
        vals = [v for cr in r.values() for v in cr.values() if v]
        marks = [1.0] + ([target] if target else [])
        lo = 10 ** math.floor(math.log10(min(vals + marks) / 1.2))
        hi = 10 ** math.ceil(math.log10(max(vals + marks) * 1.2))
        gp.append(f"set yrange [{lo:g}:{hi:g}]")
        legend = "black: raw TCP = 1" + (f"; red dashes: target {target:g}" if target else "")
        gp.append(f"set title \"{title}\\n{legend}\"")
        gp.append(f"set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead lw 2 lc rgb 'black'")
        if target:
            gp.append(f"set arrow 2 from graph 0, first {target} to graph 1, first {target} nohead lw 2 "
                      f"dt 2 lc rgb 'red'")
        else:
            gp.append("unset arrow 2")
        cols = " , ".join(
            f"'{dat}' using {i + 2}:xtic(1) title columnheader({i + 2})" for i in range(len(sizes)))
        gp.append(f"plot {cols}")
    gp.append("unset multiplot")
    gpath = os.path.join(dirpath, "plot.gp")
    with open(gpath, "w") as f:
        f.write("\n".join(gp) + "\n")
    try:
        subprocess.run(["gnuplot", gpath], check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"side_by_side: gnuplot failed: {e}", file=sys.stderr)


# ---------------------------------------------------------------------------------------
# Syscall profile (strace -f -ttt logs)
# ---------------------------------------------------------------------------------------

STRACE_LINE = re.compile(r"^(\d+)\s+([\d.]+)\s+(.*)$")


def strace_calls(path):
    """(tid, timestamp, name) of every system call that a strace -f -ttt log starts."""
    calls = []
    with open(path, errors="replace") as f:
        for line in f:
            m = STRACE_LINE.match(line)
            if not m:
                continue
            tid, ts, rest = m.groups()
            if rest.startswith(("<...", "+++", "---")):
                continue  # a resumed call (counted where it started), an exit or a signal
            calls.append((tid, float(ts), rest.split("(", 1)[0]))
    return calls


def profile_row(label, counter, threads, messages):
    total = sum(counter.values())
    top = ", ".join(f"{name} {n / messages:.1f}" for name, n in counter.most_common(5))
    return f"| {label} | {threads} | {total / messages:.1f} | {top} |"


def cmd_syscalls(a):
    """Markdown rows: system calls per message of one profiled run.

    --split: the log is one `peercm perf --loopback` process; its peercm phase runs from the
    first connect() to the last one (the TCP baseline's), which starts the baseline phase.
    Otherwise every log given (server and client of one tool) is summed."""
    import collections
    rows = []
    if a.split:
        calls = strace_calls(a.logs[0])
        connects = [ts for _, ts, name in calls if name == "connect"]
        if len(connects) < 2:
            print(f"side_by_side: {a.logs[0]}: fewer than two connect() calls", file=sys.stderr)
            return 1
        phases = {"peercm": (connects[0], connects[-1]), "TCP baseline": (connects[-1], float("inf"))}
        for phase, (t0, t1) in phases.items():
            c = collections.Counter(name for _, ts, name in calls if t0 <= ts < t1)
            tids = {tid for tid, ts, _ in calls if t0 <= ts < t1}
            rows.append(profile_row(f"{a.label}: {phase}", c, len(tids), a.messages))
    else:
        c, tids = collections.Counter(), set()
        for i, log in enumerate(a.logs):
            calls = strace_calls(log)
            c.update(name for _, _, name in calls)
            tids |= {(i, tid) for tid, _, _ in calls}
        rows.append(profile_row(a.label, c, len(tids), a.messages))
    print("\n".join(rows))
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("emit")
    e.add_argument("raw")
    e.add_argument("kind", choices=sorted(PARSERS))
    e.add_argument("log")
    e.add_argument("--rep", required=True)
    e.add_argument("--seq", required=True)
    e.add_argument("--group", required=True)
    e.add_argument("--size", required=True)
    e.add_argument("--contender", required=True)
    e.add_argument("--keep", default="", help="comma-separated stats to keep (default: all)")
    r = sub.add_parser("report")
    r.add_argument("dir")
    q = sub.add_parser("parse")
    q.add_argument("dir")
    y = sub.add_parser("syscalls")
    y.add_argument("--label", required=True)
    y.add_argument("--messages", type=float, required=True, help="round trips or messages of the run")
    y.add_argument("--split", action="store_true")
    y.add_argument("logs", nargs="+")
    a = p.parse_args()
    if a.cmd == "emit":
        return cmd_emit(a)
    if a.cmd == "syscalls":
        return cmd_syscalls(a)
    if a.cmd == "parse":
        return 1 if cmd_parse(a.dir) else 0
    return report(a.dir)


if __name__ == "__main__":
    sys.exit(main())
