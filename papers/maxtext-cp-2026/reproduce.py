#!/usr/bin/env python3
"""Predicts MaxText's context-parallel PR results on TPU v5p (PRs #4687 and #4836, from the
project's reference data) with `ctxpar predict` on the tpu-v5p profile; writes points.csv,
predicted_vs_published.png and prints the README table.
Usage: /usr/bin/python3 papers/maxtext-cp-2026/reproduce.py

Mapping:
  PR 4687: Llama 2 7B (papers/maxtext-cp-2026/llama2-7b.toml), 64 chips, CP16, 2M tokens per step
           = 64 sequences of 32K -> predict_mesh=dp:4,ring:16 batch=16 (sequences per replica);
           the published step times are in the rows' notes (8.90 / 8.83 / 16.38 s).
  PR 4836: Llama 3 8B, 64 chips, CP64, batch 1, no load balancing -> predict_mesh=ring:64,
           partition=contiguous; "usp AxB" = ring:A x ulysses:B (the PR's repro command:
           ici_context_parallelism=16 (ring) x ici_context_ulysses_parallelism=4); remat=full:
           the command leaves MaxText's default remat_policy 'full' (src/maxtext/configs/base.yml).
  PR 4687 ran remat_policy=custom with only the attention output saved: between ctxpar's
           remat=none and remat=full; predicted with none, and the full-remat value is printed
           beside it as the other end of that range.
  Both: shard=params (MaxText shards weights and optimizer state over the data/context axes).
Not predicted: PR 4719 (DeepSeek-V2 MLA attention is not in ctxpar's model) and the
announcement's MFU claims (no configuration table behind them).
"""
import csv
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import predict_lib as pl  # noqa: E402

TOL = 20.0
STRAT = {"ulysses": "ulysses", "all_gather": "allgather", "ring": "ring"}


def main():
    points, skipped, ranges = [], [], []
    with open(os.path.join(HERE, "published.csv")) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        src, st = r["source"], r["strategy"]
        seq = int(r["context_tokens"])
        if src == "maxtext PR 4687":
            pub = float(re.match(r"([0-9.]+) s step", r["note"]).group(1))
            args = ["--config", "papers/maxtext-cp-2026/llama2-7b.toml", "predict_mesh=dp:4,ring:16", "batch=16"]
            strategy = STRAT[st]
        elif src == "maxtext PR 4836":
            pub = float(r["value"])
            args = ["--config", "inputs/llama3-8b.toml", "partition=contiguous", "remat=full"]
            if st.startswith("usp"):
                a, b = st.split()[1].split("x")
                args.append("predict_mesh=ring:%s,ulysses:%s" % (a, b))
                strategy = "usp"
            else:
                args.append("predict_mesh=ring:64")
                strategy = STRAT[st]
        else:
            skipped.append("%s %s %s %s: %s" % (src, r["model"], st, r["context_tokens"],
                                               "MLA attention not modeled" if "4719" in src else "claim without a configuration table"))
            continue
        args += ["hardware=tpu-v5p", "predict_mode=train", "seq=%d" % seq, "shard=params"]
        pred = float(pl.row_of(pl.predict(args), strategy)["time_s"])
        if src == "maxtext PR 4687":
            full = float(pl.row_of(pl.predict(args + ["remat=full"]), strategy)["time_s"])
            ranges.append("PR 4687 %s: remat=none %.2f s (%+.1f%%), remat=full %.2f s (%+.1f%%), published %.2f s" % (
                st, pred, pl.error_pct(pred, pub), full, pl.error_pct(full, pub), pub))
        err = pl.error_pct(pred, pub)
        points.append(dict(id="%s %s %s %dK" % (src.replace("maxtext ", ""), r["model"].split(" ")[0], st, seq // 1024),
                           metric="step_time", unit="s", published=pub, predicted=pred, group=src.replace("maxtext ", ""),
                           within=abs(err) <= TOL, command=" ".join(args) + " (strategy %s)" % strategy))
    pl.write_outputs(HERE, points, TOL, "MaxText CP PRs on TPU v5p: ctxpar predict vs published step time", "step time")
    print(pl.markdown_table(points))
    print("\nwithin ±%d%%: %d of %d" % (TOL, sum(p["within"] for p in points), len(points)))
    print("not predicted:\n  " + "\n  ".join(skipped))
    print("PR 4687's custom remat lies between:\n  " + "\n  ".join(ranges))
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write(pl.markdown_table(points) + "\n\nwithin ±%d%%: %d of %d\n\nnot predicted:\n\n" % (TOL, sum(p["within"] for p in points), len(points)))
        f.write("".join("- %s\n" % s for s in skipped))
        f.write("\nPR 4687's remat_policy=custom (attention output saved) lies between ctxpar's remat=none and remat=full:\n\n")
        f.write("".join("- %s\n" % s for s in ranges))


if __name__ == "__main__":
    main()
