#!/usr/bin/env python3
"""Summarises bench/default_config.sh's samples against the targets in bench/targets.json.

Latency rows (lat8, lat64, and their -hog twins): per contender the median and the worst of
the runs' mean one-way times, and in how many repetitions peercm was at or below the better
of libfabric and UCX of the same repetition; with --waits, peercm's other wait policies
beside them (information). Stream rows: medians and worst runs in GB/s, each peercm row
against the UCX stream row; CRC-on rows against their own bound (targets.json).
"""
import csv
import json
import statistics
import sys
from collections import defaultdict


def main():
    samples, targets = sys.argv[1], json.load(open(sys.argv[2]))["default_config"]
    runs = defaultdict(dict)  # (row, contender) -> rep -> (mean, median)
    for r in csv.DictReader(open(samples)):
        median = float(r["median"]) if r["median"] else None
        runs[(r["row"], r["contender"])][int(r["rep"])] = (float(r["mean"]), median)
    rows = sorted({row for row, _ in runs})
    failures = 0
    waits = [w for w in ("peercm-block", "peercm-hybrid") if any(who == w for _, who in runs)]

    print("## Latency, one-way, us (mean of each run; median of the runs, worst run)\n")
    print("| row | peercm | peercm p50 | libfabric | UCX | UCX p50 | peercm <= best peer | target |"
          + "".join(f" {w} |" for w in waits))
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(waits))
    quiet_best = {}
    for row in [r for r in rows if r.startswith("lat")]:
        cells, per_rep = [], []
        for who in ("peercm", "libfabric", "ucx"):
            reps = runs.get((row, who), {})
            means = [m for m, _ in reps.values()]
            cells.append(f"{statistics.median(means):.2f} (worst {max(means):.2f})" if means else "-")
            if who != "libfabric":
                p50 = [p for _, p in reps.values() if p is not None]
                cells.append(f"{statistics.median(p50):.2f}" if p50 else "-")
        mine = runs.get((row, "peercm"), {})
        for rep, (mean, _) in mine.items():
            others = [runs[(row, w)][rep][0] for w in ("libfabric", "ucx") if rep in runs.get((row, w), {})]
            if others:
                per_rep.append(mean <= min(others))
        wins, n = sum(per_rep), len(per_rep)
        if row.endswith("-hog"):
            base = quiet_best.get(row[:-4])
            peer_meds = [statistics.median([m for m, _ in runs[(row, w)].values()])
                         for w in ("libfabric", "ucx") if runs.get((row, w))]
            ratio = statistics.median([m for m, _ in mine.values()]) / min(peer_meds) if mine and peer_meds else None
            ok = ratio is not None and ratio <= targets["hog_latency_ratio_to_best_peer_max"]
            verdict = f"{'PASS' if ok else 'FAIL'}: median / best peer's median {ratio:.2f} " \
                      f"(target <= {targets['hog_latency_ratio_to_best_peer_max']:g})" if ratio else "FAIL: no data"
        else:
            quiet_best[row] = True
            ok = n > 0 and wins >= targets["latency_runs_at_or_below_best_peer"] * n
            verdict = f"{'PASS' if ok else 'FAIL'} (target: {targets['latency_runs_at_or_below_best_peer']:.0%} of runs)"
        failures += not ok
        extra = ""
        for w in waits:
            means = [m for m, _ in runs.get((row, w), {}).values()]
            extra += f" {statistics.median(means):.2f} (worst {max(means):.2f}) |" if means else " - |"
        print(f"| {row} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | {cells[4]} | {wins} of {n} | {verdict} |"
              + extra)

    print("\n## Streams, 1 MiB, GB/s (median of the runs, worst run)\n")
    print("| row | median | worst | vs UCX (medians) | target |")
    print("|---|---|---|---|---|")
    ucx = [m for m, _ in runs.get(("bw", "ucx"), {}).values()]
    ucx_median = statistics.median(ucx) if ucx else None
    if ucx:
        print(f"| UCX tag_bw | {ucx_median:.2f} | {min(ucx):.2f} | | |")
    for row in [r for r in rows if r.startswith("bw-")]:
        vals = [m for m, _ in runs[(row, "peercm")].values()]
        med = statistics.median(vals)
        ratio = med / ucx_median if ucx_median else None
        bound = targets["stream_crc_on_ratio_to_ucx_min" if row.endswith("crc-on") else "stream_ratio_to_ucx_min"]
        ok = ratio is not None and ratio >= bound
        failures += not ok
        print(f"| peercm {row[3:]} | {med:.2f} | {min(vals):.2f} | {ratio:.2f} | "
              f"{'PASS' if ok else 'FAIL'} (>= {bound:g}) |" if ratio else "| - |")
    print(f"\n{failures} target check(s) fail.")


if __name__ == "__main__":
    main()
