#!/usr/bin/python3
"""Zigzag against balanced placement on real batches: `ctxpar bench cp` on the batches `ctxpar
train` would cut from a token file (windows of SEQ tokens, a document ending after each EOS token,
as `data=F eos_id=E` reads them), one bench per batch, and a summary over the batches.

    /usr/bin/python3 scripts/placement_study.py build/ctxpar TOKENS.bin [--seq 32K] [--np 4]
        [--batches 8] [--first 0] [--stride 1] [--eos 256] [--dtype uint16] [--heads 2] [--head-dim 32]
        [--steps 2] [--warmup 1] [--placements balanced,document] [--mpirun mpirun] [--csv OUT.csv]
        [--out TRACE.h5]

Each bench runs `strategy=ring frugal=true placement=P docs=L1,L2,...` (the batch's document
lengths) at seq = SEQ, so its table has three rows on the same inputs: ring (zigzag, every key row
moves), ring:frugal (zigzag, only visible rows move) and ring:P, P = balanced (rows placed from the
document lengths, shard/placement.hpp) or document (every document zigzag over all ranks on its
own: Transformer Engine's and Megatron-LM's packed-sequence layout). With several placements each
batch runs one bench per placement; the ring and ring:frugal rows are the first bench's, and every
row's time is against the ring row of its own bench. Per row the summary gives, over the batches: the attention
work's max/mean over ranks (median and worst), bytes sent per rank against the ring row's (median),
forward + backward time against the ring row's (median of the per-batch ratios), and the #wrong
total (elements off the single-rank kernel; must be 0). Token files from scripts/pack_documents.py.
Times on a shared CPU are noisy: compare the ratios, which are measured in one bench per batch.
"""
import argparse
import csv
import io
import os
import statistics
import subprocess
import sys

import numpy as np


def size_arg(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20}
    t = text.strip().upper()
    return int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)


def batch_lengths(tokens, index: int, seq: int, eos: int):
    """Document lengths of sample `index` as ctxpar's token source cuts it (modulo the windows)."""
    windows = len(tokens) // seq
    w = tokens[(index % windows) * seq:(index % windows + 1) * seq]
    ends = np.nonzero(w == eos)[0] + 1  # a document ends after each eos token
    bounds = [0] + [int(e) for e in ends if e < seq] + [seq]
    return [b - a for a, b in zip(bounds, bounds[1:]) if b > a]


def run_bench(a, lengths, placement):
    cmd = [a.mpirun, "-np", str(a.np), "--oversubscribe", "--bind-to", "none", a.binary, "bench", "cp",
           f"seq={a.seq}", "docs=" + ",".join(map(str, lengths)), "strategy=ring", "frugal=true",
           f"placement={placement}", f"heads={a.heads}", f"kv_heads={a.heads}", f"head_dim={a.head_dim}",
           f"steps={a.steps}", f"warmup={a.warmup}", "csv=true", "threads=1", f"out={a.out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"placement_study: bench cp failed (rc {r.returncode}):\n{' '.join(cmd[:12])} ...\n{r.stderr[-2000:]}")
    lines = [l for l in r.stdout.splitlines() if l and not l.startswith("#")]
    return {row["strategy"]: row for row in csv.DictReader(io.StringIO("\n".join(lines)))}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("binary")
    p.add_argument("tokens")
    p.add_argument("--seq", type=size_arg, default=32768)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--first", type=int, default=0, help="first sample index")
    p.add_argument("--stride", type=int, default=1, help="sample indices first, first + stride, ...")
    p.add_argument("--eos", type=int, default=256)
    p.add_argument("--dtype", choices=["uint16", "uint32"], default="uint16")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--placements", default="balanced", help="comma list of balanced, document")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--csv", help="per-batch rows written here")
    p.add_argument("--out", default="out/placement_study.h5", help="each bench's trace (overwritten per batch)")
    a = p.parse_args()
    tokens = np.fromfile(a.tokens, dtype="<u2" if a.dtype == "uint16" else "<u4")
    if len(tokens) < a.seq:
        sys.exit(f"placement_study: {a.tokens} holds {len(tokens)} tokens, fewer than seq = {a.seq}")
    per_row = {}
    out = []
    for i in range(a.first, a.first + a.batches * a.stride, a.stride):
        lengths = batch_lengths(tokens, i, a.seq, a.eos)
        rows, t_ring = {}, {}  # each row, and the ring row's time of its bench
        for k, placement in enumerate(a.placements.split(",")):
            got = run_bench(a, lengths, placement)
            ring_ms = float(got["ring"]["fwd_ms"]) + float(got["ring"]["bwd_ms"])
            for name, row in got.items():
                if k == 0 or name.endswith(":" + placement):
                    rows[name], t_ring[name] = row, ring_ms
        ring = rows["ring"]
        for name, row in rows.items():
            t = float(row["fwd_ms"]) + float(row["bwd_ms"])
            rec = {"batch": i, "documents": len(lengths), "longest": max(lengths), "row": name,
                   "work": float(row["work_imbalance"]), "bytes_mb": float(row["bytes_mb"]),
                   "bytes_vs_ring": float(row["bytes_mb"]) / float(ring["bytes_mb"]), "time_ms": t,
                   "time_vs_ring": t / t_ring[name], "wrong": int(row["wrong"])}
            out.append(rec)
            per_row.setdefault(name, []).append(rec)
        print(f"batch {i}: {len(lengths)} documents, longest {max(lengths)}: " +
              ", ".join(f"{n} work {float(r['work_imbalance']):.3f} time x{(float(r['fwd_ms']) + float(r['bwd_ms'])) / t_ring[n]:.2f}"
                        for n, r in rows.items()), flush=True)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0].keys()))
            w.writeheader()
            w.writerows(out)
    print(f"\n# {a.batches} batches of {a.seq} tokens from {a.tokens}, {a.np} ranks, heads {a.heads} x {a.head_dim}; "
          "work = pairs x heads per rank, max/mean; bytes and time (fwd + bwd) against the ring row of the same batch")
    print(f"# {'row':<16} {'work median':>12} {'work worst':>11} {'bytes/ring':>11} {'time/ring':>10} {'#wrong':>7}")
    bad = 0
    for name, recs in per_row.items():
        work = [r["work"] for r in recs]
        wrong = sum(r["wrong"] for r in recs)
        bad += wrong
        print(f"  {name:<16} {statistics.median(work):12.3f} {max(work):11.3f} "
              f"{statistics.median(r['bytes_vs_ring'] for r in recs):11.3f} "
              f"{statistics.median(r['time_vs_ring'] for r in recs):10.3f} {wrong:7d}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
