#!/usr/bin/env python3
"""Plots of dcp_bench results (matplotlib). PNGs are written next to each input CSV.

  --routes routes.csv   -> routes_speedup.png: t_mqa / t_dense against seq_len, one line per
                           batch size, one panel per per-rank head count (pure prefills the
                           planner routes to dense MHA; above 1: the dense MHA route wins);
                           routes_latency.png: both routes' layer latency against seq_len.
  --kernels kernels.csv -> kernels_tflops.png: our attention and GEMM TFLOP/s per shape with
                           the GEMM ceiling of the same run; kernels_gbps.png: the memory-bound
                           kernels' GB/s over the size sweep with the copy ceiling.
  --peers peers.csv     -> peers_dense_mha.png, peers_sparse_mqa.png: our TFLOP/s against each
                           torch peer per shape (scripts/peer_torch.py output).
  --targets FILE        -> where each target of issue 7 stands, as a Markdown table (FILE and
                           stdout), from whichever CSVs are given.

  python3 scripts/plot_bench.py --routes out/routes.csv --kernels out/kernels.csv \\
      --peers out/peers.csv
"""

import argparse
import csv
import math
import os
import sys
from collections import defaultdict


def fail(message):
    print(f"plot_bench.py: {message}", file=sys.stderr)
    sys.exit(2)


def read_csv(path, required):
    if not os.path.isfile(path):
        fail(f"no such file: {path}")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        fail(f"{path} lacks columns {', '.join(missing)} (not a dcp_bench CSV of that mode?)")
    return rows


def number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def out_path(csv_path, name):
    return os.path.join(os.path.dirname(os.path.abspath(csv_path)), name)


def grid(n):
    cols = min(n, 2)
    return (n + cols - 1) // cols, cols


def plot_routes(plt, path):
    rows = read_csv(path, ["batch", "num_seqs", "seq_len", "heads", "route_auto", "auto_us",
                           "mqa_us", "speedup_mqa_over_auto", "uniform", "has_context",
                           "status"])
    # (heads) -> (num_seqs) -> [(seq_len, speedup, auto_us, mqa_us, route)]
    series = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["status"] != "ok" or row["uniform"] != "1" or row["has_context"] != "0":
            continue
        series[int(row["heads"])][int(row["num_seqs"])].append(
            (int(row["seq_len"]), number(row["speedup_mqa_over_auto"]), number(row["auto_us"]),
             number(row["mqa_us"]), row["route_auto"]))
    if not series:
        print(f"plot_bench.py: {path}: no pure-prefill rows to plot", file=sys.stderr)
        return []
    written = []
    heads_list = sorted(series)
    nrows, ncols = grid(len(heads_list))

    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.2 * nrows), squeeze=False)
    for ax, heads in zip(axes.flat, heads_list):
        for num_seqs in sorted(series[heads]):
            points = sorted(p for p in series[heads][num_seqs]
                            if p[1] is not None and p[4] == "dense_mha")
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                        label=f"batch {num_seqs}")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seq_len (pure prefill)")
        ax.set_ylabel("t_mqa / t_dense_mha")
        ax.set_title(f"{heads} heads per rank")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(heads_list):]:
        ax.set_visible(False)
    fig.suptitle("routes: t_mqa / t_dense (> 1: dense MHA wins)", fontsize=11)
    fig.tight_layout()
    written.append(out_path(path, "routes_speedup.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.2 * nrows), squeeze=False)
    for ax, heads in zip(axes.flat, heads_list):
        for index, num_seqs in enumerate(sorted(series[heads])):
            points = sorted(series[heads][num_seqs])
            color = f"C{index % 10}"
            dense = [p for p in points if p[4] == "dense_mha" and p[2] is not None]
            sparse = [p for p in points if p[3] is not None]
            if dense:
                ax.plot([p[0] for p in dense], [p[2] for p in dense], color=color, marker="o",
                        label=f"batch {num_seqs} auto (dense)")
            if sparse:
                ax.plot([p[0] for p in sparse], [p[3] for p in sparse], color=color,
                        marker="x", linestyle=":", label=f"batch {num_seqs} sparse MQA")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("seq_len (pure prefill)")
        ax.set_ylabel("layer latency (us)")
        ax.set_title(f"{heads} heads per rank")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(heads_list):]:
        ax.set_visible(False)
    fig.suptitle("routes: DcpContext::Forward latency", fontsize=11)
    fig.tight_layout()
    written.append(out_path(path, "routes_latency.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def plot_kernels(plt, path):
    rows = read_csv(path, ["kernel", "batch", "heads", "time_us", "tflops", "gbps", "status"])
    ok = [r for r in rows if r["status"] == "ok"]
    gemm = next((number(r["tflops"]) for r in ok if r["kernel"] == "gemm_ceiling"), None)
    copy = next((number(r["gbps"]) for r in ok if r["kernel"] == "copy_ceiling"), None)
    written = []

    compute = [r for r in ok if number(r["tflops"]) is not None and r["kernel"] != "gemm_ceiling"]
    if compute:
        kernels = sorted({r["kernel"] for r in compute})
        labels = []
        for r in compute:
            label = f"{r['batch']} h{r['heads']}"
            if label not in labels:
                labels.append(label)
        fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(labels) * len(kernels) / 2), 5))
        width = 0.8 / len(kernels)
        for k, kernel in enumerate(kernels):
            values = {f"{r['batch']} h{r['heads']}": number(r["tflops"])
                      for r in compute if r["kernel"] == kernel}
            xs = [i + k * width for i, label in enumerate(labels) if label in values]
            ys = [values[label] for label in labels if label in values]
            ax.bar(xs, ys, width=width, label=kernel)
        if gemm:
            ax.axhline(gemm, color="black", linestyle="--", linewidth=0.8,
                       label=f"GEMM ceiling {gemm:.3g}")
        ax.set_xticks([i + (len(kernels) - 1) * width / 2 for i in range(len(labels))])
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title("dcp_bench kernels: compute-bound kernels")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        written.append(out_path(path, "kernels_tflops.png"))
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)

    memory = [r for r in ok if r["batch"] and number(r.get("size_bytes")) is not None
              and number(r["gbps"]) is not None and r["kernel"] != "copy_ceiling"]
    if memory:
        fig, ax = plt.subplots(figsize=(8, 5))
        by_kernel = defaultdict(list)
        for r in memory:
            by_kernel[r["kernel"]].append((number(r["size_bytes"]), number(r["gbps"])))
        for kernel, points in sorted(by_kernel.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=kernel)
        if copy:
            ax.axhline(copy, color="black", linestyle="--", linewidth=0.8,
                       label=f"copy ceiling {copy:.3g}")
            ax.axhline(0.8 * copy, color="gray", linestyle=":", linewidth=0.8,
                       label="80% of copy (target)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes of the main output)")
        ax.set_ylabel("GB/s (read + write)")
        ax.set_title("dcp_bench kernels: memory-bound kernels")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        written.append(out_path(path, "kernels_gbps.png"))
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


def plot_peers(plt, path):
    rows = read_csv(path, ["source", "op", "batch", "heads", "ours_tflops", "peer",
                           "peer_tflops"])
    written = []
    for op in ("dense_mha", "sparse_mqa"):
        selected = [r for r in rows if r["op"] == op]
        if not selected:
            continue
        labels, ours, peers = [], {}, defaultdict(dict)
        for r in selected:
            label = f"{r['source'][0]}:{r['batch']} h{r['heads']}"
            if label not in labels:
                labels.append(label)
            ours[label] = number(r["ours_tflops"])
            peers[r["peer"]][label] = number(r["peer_tflops"])
        names = ["dcp"] + sorted(peers)
        width = 0.8 / len(names)
        fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(labels) * len(names)), 5))
        for k, name in enumerate(names):
            values = ours if name == "dcp" else peers[name]
            xs = [i + k * width for i, label in enumerate(labels)
                  if values.get(label) is not None]
            ys = [values[label] for label in labels if values.get(label) is not None]
            ax.bar(xs, ys, width=width, label=name)
        ax.set_xticks([i + (len(names) - 1) * width / 2 for i in range(len(labels))])
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s (useful FLOPs)")
        ax.set_title(f"{op}: dcp vs torch peers (r: routes attention phase, k: kernel alone)")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        written.append(out_path(path, f"peers_{op}.png"))
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


def human_bytes(text):
    value = number(text) or 0
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift:
            return f"{value / (1 << shift):.3g} {unit}"
    return f"{value:.0f} B"


def summarize(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[0], values[len(values) // 2], values[-1]


def target_rows(routes, kernels, peers):
    """(target, measured, status) for the four targets of issue 7."""
    rows = []
    if peers is not None:
        for op, peer, goal, name in (
                ("dense_mha", "sdpa_cudnn", 1.0,
                 "dense MHA at least as fast as torch cuDNN SDPA on every routes shape"),
                ("sparse_mqa", "torch_gather_bmm", 4.0,
                 "sparse MQA at least 4x torch gather + bmm")):
            for source in ("routes", "kernels"):
                selected = [r for r in peers if r["op"] == op and r["peer"] == peer
                            and r["source"] == source and number(r["speedup_vs_peer"])]
                stats = summarize(number(r["speedup_vs_peer"]) for r in selected)
                if stats is None:
                    continue
                worst = min(selected, key=lambda r: number(r["speedup_vs_peer"]))
                below = sum(1 for r in selected if number(r["speedup_vs_peer"]) < goal)
                best_tflops = max(number(r["ours_tflops"]) or 0 for r in selected)
                rows.append((
                    f"{name} ({source})",
                    f"{len(selected)} shapes: ours/peer speed min {stats[0]:.2f}x, median "
                    f"{stats[1]:.2f}x, max {stats[2]:.2f}x; worst {worst['batch']} "
                    f"h{worst['heads']}; best {best_tflops:.0f} TFLOP/s",
                    "met" if below == 0 else f"not met ({below} shapes below {goal:g}x)"))
    if kernels is not None:
        copy = next((number(r["gbps"]) for r in kernels
                     if r["kernel"] == "copy_ceiling" and r["status"] == "ok"), None)
        sweep = [r for r in kernels if r["status"] == "ok" and number(r.get("size_bytes"))
                 and r["kernel"] in ("gather_rows", "scatter_rows", "merge_states",
                                     "dcp_correct", "dcp_combine")]
        if copy and sweep:
            # Each kernel at its largest size of the sweep (row kernels round to whole rows).
            largest = {}
            for r in sweep:
                if r["kernel"] not in largest or \
                        number(r["size_bytes"]) > number(largest[r["kernel"]]["size_bytes"]):
                    largest[r["kernel"]] = r
            parts = [f"{k} {number(r['ceiling_pct']):.0f}% at {human_bytes(r['size_bytes'])}"
                     for k, r in sorted(largest.items())]
            below = [r for r in largest.values() if number(r["ceiling_pct"]) < 80]
            rows.append((
                "workspace fill and combine kernels at least 80% of the copy bandwidth",
                f"copy {copy:.0f} GB/s; " + ", ".join(parts),
                "met" if not below else f"not met ({len(below)} kernels below 80%)"))
    if routes is not None:
        dense = [r for r in routes if r["status"] == "ok" and r["route_auto"] == "dense_mha"
                 and number(r["speedup_mqa_over_auto"]) is not None]
        if dense:
            slower = [r for r in dense if number(r["speedup_mqa_over_auto"]) < 1.0]
            stats = summarize(number(r["speedup_mqa_over_auto"]) for r in dense)
            worst = min(dense, key=lambda r: number(r["speedup_mqa_over_auto"]))
            rows.append((
                "dense MHA route faster than sparse MQA for every prefill batch, seq_len <= K",
                f"{len(dense)} batches: t_mqa/t_dense min {stats[0]:.2f} ({worst['batch']} "
                f"h{worst['heads']}), median {stats[1]:.2f}, max {stats[2]:.2f}",
                "met" if not slower else f"not met ({len(slower)} batches where MQA wins)"))
    return rows


def write_targets(path, routes, kernels, peers):
    lines = ["| target (issue 7) | measured | status |", "|---|---|---|"]
    for target, measured, status in target_rows(routes, kernels, peers):
        lines.append(f"| {target} | {measured} | {status} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routes", help="dcp_bench --mode routes CSV")
    parser.add_argument("--kernels", help="dcp_bench --mode kernels CSV")
    parser.add_argument("--peers", help="scripts/peer_torch.py CSV")
    parser.add_argument("--targets", help="write where each target stands (Markdown) here")
    args = parser.parse_args()
    if not (args.routes or args.kernels or args.peers):
        parser.error("give at least one of --routes, --kernels, --peers")
    for path in (args.routes, args.kernels, args.peers):
        if path and not os.path.isfile(path):
            fail(f"no such file: {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed (pip install matplotlib)")

    written = []
    if args.routes:
        written += plot_routes(plt, args.routes)
    if args.kernels:
        written += plot_kernels(plt, args.kernels)
    if args.peers:
        written += plot_peers(plt, args.peers)
    if args.targets:
        routes = read_csv(args.routes, ["route_auto", "speedup_mqa_over_auto"]) \
            if args.routes else None
        kernels = read_csv(args.kernels, ["kernel", "gbps", "ceiling_pct", "size_bytes"]) \
            if args.kernels else None
        peers = read_csv(args.peers, ["op", "peer", "source", "speedup_vs_peer"]) \
            if args.peers else None
        written.append(write_targets(args.targets, routes, kernels, peers))
    for path in written:
        print(f"plot_bench.py: wrote {path}")
    if not written:
        fail("nothing to plot in the given CSVs")


if __name__ == "__main__":
    main()
