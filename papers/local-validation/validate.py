#!/usr/bin/env python3
"""Predicted vs measured on this machine: calibrates the `local` profile (`ctxpar bench calibrate`,
2 ranks), runs a sweep of our own runs with mpirun (strategies x lengths x np 1, 2, 4 x training
step / full prefill), predicts each with `ctxpar predict hardware=local`, and writes points.csv,
predicted_vs_measured.png and prints the README table. Goal: step times (training) and TTFTs
(prefill) within ±20%.
Usage: /usr/bin/python3 papers/local-validation/validate.py [--quick] [--passes=N] [--no-calibrate]
Each point is measured and predicted in N passes (default 2; --quick: 1 pass, S = 2K only), each
pass with its own calibration; the table compares the means and lists every pass's error.
Run it on a quiet machine: every rank runs one OpenMP thread and ranks share the cores, so other
jobs on the machine change both the calibration and the measured runs.
"""
import csv
import os
import shutil
import subprocess
import sys
import tempfile

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import predict_lib as pl  # noqa: E402

TOL = 20.0
MODEL = ["layers=2", "dim=256", "ffn_dim=768", "heads=8", "kv_heads=2", "head_dim=64", "vocab=1024", "docs=none"]
PREDICT_MODEL = [a for a in MODEL if not a.startswith("docs=")]  # predict prices no document mix
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")


def mpirun(np_, args):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), pl.ctxpar_binary()] + args
    r = subprocess.run(cmd, cwd=pl.ROOT, capture_output=True, text=True, env=ENV)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stdout + r.stderr))
    return r.stdout


def measured_step_s(path, key="time_s_median"):
    """Median step time (or TTFT) over the measured steps (the trace's summary excludes warmup)."""
    with h5py.File(path, "r") as f:
        return float(f["summary"].attrs[key])


# The executed strategy → the cost model's name for it (a full prefill's ring is pass-KV).
PREFILL_NAME = {"ring": "pass_kv", "allgather": "allgather", "ulysses": "ulysses", "usp": "usp"}


def sweep(quick):
    """One pass: calibrate, then measure and predict every point. Returns {point id: (measured, predicted, meta)}."""
    if "--no-calibrate" not in sys.argv:
        print(mpirun(2, ["bench", "calibrate", "threads=1", "out=/tmp/ctxpar_cal.h5"] + MODEL))
    seqs = [2048] if quick else [2048, 4096]
    cases = [(1, "ring", "ring:1")]
    for np_ in (2, 4):
        for st in ("allgather", "ulysses", "ring"):
            cases.append((np_, st, "ring:%d" % np_))
    cases.append((4, "usp", "ulysses:2,ring:2"))
    out = {}
    for kind in ("train", "prefill"):
        for seq in seqs:
            for np_, st, mesh in cases:
                path = "/tmp/ctxpar_val_%s_%d_%s_%d.h5" % (kind, np_, st, seq)
                common = MODEL + ["threads=1", "seq=%d" % seq, "strategy=" + st, "mesh=" + mesh, "out=" + path]
                if kind == "train":
                    mpirun(np_, ["train"] + common + ["steps=5", "warmup=1"])
                    meas = measured_step_s(path)
                    model_name, mode = st, "train"
                else:
                    # Full prefills of `seq` tokens with the strategy (cp_algo=pass_kv keeps the
                    # configured strategy for a prefill with no cache); TTFT median.
                    mpirun(np_, ["prefill"] + common + ["miss_rate=1", "cp_algo=pass_kv", "steps=9", "warmup=1"])
                    meas = measured_step_s(path, "ttft_s_median")
                    model_name, mode = PREFILL_NAME[st], "prefill"
                rows = pl.predict(PREDICT_MODEL + ["hardware=local", "predict_mode=" + mode, "seq=%d" % seq, "predict_mesh=" + mesh])
                pred = float(pl.row_of(rows, model_name)["time_s"])
                pid = "%s np%d %s S=%d" % (kind, np_, st, seq)
                out[pid] = (meas, pred, dict(metric="step_time" if kind == "train" else "ttft", group="%s np%d" % (kind, np_),
                                             command="predict_mode=%s predict_mesh=%s seq=%d (strategy %s)" % (mode, mesh, seq, model_name)))
                print("%-32s measured %.4f s predicted %.4f s error %+.1f%%" % (pid, meas, pred, pl.error_pct(pred, meas)), flush=True)
    return out


def main():
    quick = "--quick" in sys.argv
    passes = 1 if quick else 2
    for a in sys.argv[1:]:
        if a.startswith("--passes="):
            passes = int(a.split("=", 1)[1])
    runs = []
    for i in range(passes):
        print("# pass %d of %d" % (i + 1, passes), flush=True)
        runs.append(sweep(quick))
    report(runs, "points.csv", "predicted_vs_measured.png",
           "ctxpar train / prefill on this machine: predicted (local profile) vs measured")


def report(runs, csv_name, png_name, title):
    """The passes' means per point: CSV_NAME and PNG_NAME in this folder, the README table (with
    each pass's error) and the count within ±TOL on stdout. runs: one {point id: (measured,
    predicted, meta)} per pass."""
    passes = len(runs)
    points = []
    for pid in runs[0]:
        meas = sum(r[pid][0] for r in runs) / passes
        pred = sum(r[pid][1] for r in runs) / passes
        meta = runs[0][pid][2]
        per_pass = " / ".join("%+.1f%%" % pl.error_pct(r[pid][1], r[pid][0]) for r in runs)
        points.append(dict(id=pid, metric=meta["metric"], unit="s", published=meas, predicted=pred, group=meta["group"],
                           within=abs(pl.error_pct(pred, meas)) <= TOL, command=meta["command"] + "; passes: " + per_pass))
    # write_outputs names its files points.csv and predicted_vs_published.png: written aside, then
    # moved to this validation's names (the one-host and the cross-host files live side by side).
    tmp = tempfile.mkdtemp(prefix="ctxpar_val_")
    pl.write_outputs(tmp, points, TOL, title, "step time / TTFT", reference="measured")
    shutil.move(os.path.join(tmp, "points.csv"), os.path.join(HERE, csv_name))
    shutil.move(os.path.join(tmp, "predicted_vs_published.png"), os.path.join(HERE, png_name))
    os.rmdir(tmp)
    table = pl.markdown_table(points).replace("published", "measured").split("\n")
    table[0] += " per pass |"
    table[1] += "---|"
    for i, p in enumerate(points):
        table[i + 2] += " %s |" % p["command"].split("passes: ")[1]
    print("\n".join(table))
    errs = sorted(abs(pl.error_pct(p["predicted"], p["published"])) for p in points)
    print("\nwithin ±%d%%: %d of %d (mean of %d passes, each with its own calibration; median |error| %.1f%%); "
          "load average at the end: %s" % (TOL, sum(p["within"] for p in points), len(points), passes, errs[len(errs) // 2],
                                            open("/proc/loadavg").read().split()[:3]))

if __name__ == "__main__":
    main()
