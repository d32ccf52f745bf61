"""Tests of analysis/ (tables, figures, Perfetto export) on traces made by the real program.

    test_analysis.py --make-traces --ctxpar build/ctxpar --mpirun mpirun --source . --workdir W
    test_analysis.py --case mfu|exposed|scaling|timeline|perfetto|cli|loader|summary --source . --workdir W

--make-traces runs ctxpar five times (ctest fixture `analysis_traces`):
  run-ring-p2-s1K, run-allgather-p2-s1K, run-ring-p1-s512, run-ring-p1-s1K  (`ctxpar run`, tiny)
  train-ring-p2  (`ctxpar train --config inputs/tiny.toml steps=2`)
so that there is one strong-scaling series (run, ring, S=1K at P=1,2) and one weak-scaling series
(run, ring, S/P=512 at P=1,2) and nothing else at two rank counts. Each --case checks one figure
function (PNG written and readable, CSV columns and rows, values recomputed from the traces).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np

RUN_SMALL = ["heads=4", "kv_heads=4", "head_dim=32", "steps=2", "warmup=1", "bench_max_bytes=4K", "bench_iters=1"]
TRACES = {  # name -> (ranks, ctxpar arguments)
    "run-ring-p2-s1K": (2, ["run", "strategy=ring", "seq=1K"] + RUN_SMALL),
    "run-allgather-p2-s1K": (2, ["run", "strategy=allgather", "seq=1K"] + RUN_SMALL),
    "run-ring-p1-s512": (1, ["run", "strategy=ring", "seq=512"] + RUN_SMALL),
    "run-ring-p1-s1K": (1, ["run", "strategy=ring", "seq=1K"] + RUN_SMALL),
    "train-ring-p2": (2, ["train", "--config", "inputs/tiny.toml", "steps=2"]),
}
TIMELINE_TRACE = "run-ring-p2-s1K"


def check(cond, msg: str):
    if not cond:
        raise AssertionError(msg)


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def make_traces(args) -> None:
    tdir = os.path.join(args.workdir, "traces")
    shutil.rmtree(tdir, ignore_errors=True)
    os.makedirs(tdir)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    for name, (np_, cargs) in TRACES.items():
        out = os.path.join(tdir, name + ".h5")
        cmd = [args.mpirun, "-np", str(np_), "--oversubscribe", "--bind-to", "none", args.ctxpar] + cargs + [f"out={out}"]
        p = subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        check(os.path.isfile(out), f"{out} not written")
    # Not a trace: found by directory search it must be skipped, named explicitly it is an error.
    import h5py
    with h5py.File(os.path.join(tdir, "not-a-trace.h5"), "w") as f:
        f["x"] = np.arange(3)
    print(f"made {len(TRACES)} traces in {tdir}")


def read_csv(path: str):
    check(os.path.isfile(path), f"no CSV {path}")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    check(len(rows) >= 1, f"{path} is empty (no header)")
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def check_png(path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    check(os.path.isfile(path), f"no PNG {path}")
    with open(path, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG")
    img = plt.imread(path)
    check(img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, f"{path}: image shape {img.shape}")
    # A figure that drew something has more than a handful of colours.
    check(len(np.unique(img.reshape(-1, img.shape[2]), axis=0)) > 8, f"{path} looks blank")


class Ctx:
    def __init__(self, args):
        sys.path.insert(0, args.source)
        from analysis import ctxpar_trace, figures, perfetto, tables
        self.ct, self.figures, self.perfetto, self.tables = ctxpar_trace, figures, perfetto, tables
        self.source = args.source
        self.tdir = os.path.join(args.workdir, "traces")
        self.out = os.path.join(args.workdir, "out-" + args.case)
        shutil.rmtree(self.out, ignore_errors=True)
        os.makedirs(self.out)
        self.traces = {n: ctxpar_trace.load(os.path.join(self.tdir, n + ".h5")) for n in TRACES}

    def runs(self, peak=None):
        return self.tables.run_table(list(self.traces.values()), peak)


def median_measured(t, col):
    return float(np.median(t.measured_steps()[col]))


# ---------------------------------------------------------------------------------------------


def case_loader(c: Ctx):
    """load_traces over the directory skips the non-trace file; naming it is an error."""
    import io
    note = io.StringIO()
    found = c.tables.load_traces([c.tdir], warn=note)
    check(len(found) == len(TRACES), f"{len(found)} traces found, expected {len(TRACES)}")
    check("not-a-trace.h5" in note.getvalue(), f"no note about the skipped file: {note.getvalue()!r}")
    try:
        c.tables.load_traces([os.path.join(c.tdir, "not-a-trace.h5")])
        raise AssertionError("a named non-trace file was accepted")
    except c.ct.TraceError:
        pass
    runs = c.runs()
    check(len(runs) == len(TRACES), f"run_table has {len(runs)} rows")
    by = {r["run"]: r for r in runs}
    check(set(by) == set(TRACES), f"run names {sorted(by)}")
    for name, (np_, _a) in TRACES.items():
        t, r = c.traces[name], by[name]
        check(r["ranks"] == np_, f"{name}: ranks {r['ranks']}")
        for col in ("time_s", "tflops_per_rank", "exposed_comm_s", "model_flops"):
            check(close(r[col], median_measured(t, col)), f"{name}: {col} {r[col]} != median {median_measured(t, col)}")
        check(r["measured_steps"] == len(t.steps) - t.warmup_steps(), f"{name}: measured_steps")
    # MFU: train records a peak, run does not (NaN) unless one is given.
    check(by["train-ring-p2"]["mfu"] > 0 and close(by["train-ring-p2"]["mfu"], median_measured(c.traces["train-ring-p2"], "mfu")),
          f"train mfu {by['train-ring-p2']['mfu']}")
    check(math.isnan(by["run-ring-p2-s1K"]["mfu"]), "run mode without a peak must have mfu NaN")
    with_peak = {r["run"]: r for r in c.runs(peak=2.0)}
    check(close(with_peak["run-ring-p2-s1K"]["mfu"], with_peak["run-ring-p2-s1K"]["tflops_per_rank"] / 2.0),
          "mfu with --peak-tflops-per-rank")


def case_mfu(c: Ctx):
    runs = c.runs()
    png, csvp = c.figures.fig_mfu_vs_seq(runs, os.path.join(c.out, "mfu.png"))
    check_png(png)
    header, rows = read_csv(csvp)
    check(tuple(header) == c.figures.MFU_COLUMNS, f"header {header}")
    # Every trace has its own (mode, strategy, ranks, seq): one row each.
    check(len(rows) == len(TRACES), f"{len(rows)} rows, expected {len(TRACES)}")
    by = {(r["mode"], r["strategy"], int(r["ranks"]), int(r["seq"])): r for r in runs}
    for row in rows:
        r = by[(row["mode"], row["strategy"], int(row["ranks"]), int(row["seq"]))]
        check(close(float(row["tflops_per_rank"]), r["tflops_per_rank"]), f"tflops {row}")
        check(close(float(row["mfu"]), r["mfu"]), f"mfu {row}")
        check(int(row["traces"]) == 1, f"traces {row}")


def case_exposed(c: Ctx):
    runs = c.runs()
    png, csvp = c.figures.fig_exposed_comm(runs, os.path.join(c.out, "exposed.png"))
    check_png(png)
    header, rows = read_csv(csvp)
    check(tuple(header) == c.figures.EXPOSED_COLUMNS, f"header {header}")
    check(len(rows) == len(TRACES), f"{len(rows)} rows, expected {len(TRACES)}")
    by_key = {}
    for name, t in c.traces.items():
        r = c.tables.run_row(t)
        by_key[(r["mode"], r["strategy"], r["ranks"], r["seq"])] = t
    for row in rows:
        t = by_key[(row["mode"], row["strategy"], int(row["ranks"]), int(row["seq"]))]
        s = t.measured_steps()
        expect = float(np.median(s["exposed_comm_s"] / s["time_s"]))
        frac = float(row["exposed_comm_frac"])
        check(close(frac, expect), f"exposed fraction {frac} != {expect}")
        check(0.0 <= frac <= 1.0, f"exposed fraction {frac} outside [0, 1]")


def case_scaling(c: Ctx):
    runs = c.runs()
    sc = c.tables.scaling_table(runs)
    png, csvp = c.figures.fig_scaling(sc, os.path.join(c.out, "scaling.png"))
    check_png(png)
    header, rows = read_csv(csvp)
    check(tuple(header) == c.tables.SCALING_COLUMNS, f"header {header}")
    # strong: run/ring/S=1K at P=1,2; weak: run/ring/S/P=512 at P=1 (S=512), P=2 (S=1K).
    got = sorted((r["kind"], r["strategy"], int(r["seq"]), int(r["ranks"])) for r in rows)
    want = sorted([("strong", "ring", 1024, 1), ("strong", "ring", 1024, 2),
                   ("weak", "ring", 512, 1), ("weak", "ring", 1024, 2)])
    check(got == want, f"scaling rows {got}, expected {want}")
    by = {r["run"]: r for r in runs}
    p1, p2, p1h = by["run-ring-p1-s1K"], by["run-ring-p2-s1K"], by["run-ring-p1-s512"]
    for row in rows:
        eff = float(row["efficiency"])
        if int(row["ranks"]) == 1:
            check(eff == 1.0, f"base efficiency {eff}")
        elif row["kind"] == "strong":
            check(close(eff, p1["time_s"] / (2 * p2["time_s"])), f"strong efficiency {eff}")
        else:
            expect = (p2["model_flops"] / (p2["time_s"] * 2)) / (p1h["model_flops"] / p1h["time_s"])
            check(close(eff, expect), f"weak efficiency {eff} != {expect}")
            check(close(float(row["efficiency_time"]), p1h["time_s"] / p2["time_s"]), "weak efficiency_time")
    # No series: the figure is still written, with a header-only CSV.
    png2, csv2 = c.figures.fig_scaling([], os.path.join(c.out, "scaling-empty.png"))
    check_png(png2)
    check(len(read_csv(csv2)[1]) == 0, "empty scaling table wrote rows")


def case_timeline(c: Ctx):
    for name, step in ((TIMELINE_TRACE, None), ("train-ring-p2", 1)):
        t = c.traces[name]
        tl = c.tables.timeline_table(t, step)
        want_step = step if step is not None else t.warmup_steps()  # first measured step
        spans = t.spans_where(step=want_step)
        png, csvp = c.figures.fig_timeline(tl, os.path.join(c.out, f"timeline-{name}.png"))
        check_png(png)
        header, rows = read_csv(csvp)
        check(tuple(header) == c.tables.TIMELINE_COLUMNS, f"header {header}")
        check(len(rows) == len(spans) and len(spans) > 0, f"{name}: {len(rows)} rows, {len(spans)} spans in step {want_step}")
        check({int(r["step"]) for r in rows} == {want_step}, f"{name}: steps {set(r['step'] for r in rows)}")
        check({int(r["rank"]) for r in rows} == set(range(t.world_size)), f"{name}: ranks")
        begins = np.array([float(r["begin_us"]) for r in rows])
        check(begins.min() == 0.0, f"{name}: times not relative to the step's first span")
        durs = np.array([float(r["duration_us"]) for r in rows])
        check(close(float(durs.sum()), float((spans["t_end_us"] - spans["t_begin_us"]).sum()), 1e-9), f"{name}: durations")
        for r in rows:
            check(r["group"] == c.tables.phase_group(r["phase"]), f"{name}: group of {r['phase']}")
        groups = {r["group"] for r in rows}
        check("compute" in groups, f"{name}: no compute spans in the timeline ({groups})")
        if name == TIMELINE_TRACE:
            check("wait" in groups or "comm" in groups, f"ring run without communication spans ({groups})")


def case_perfetto(c: Ctx):
    path = os.path.join(c.tdir, TIMELINE_TRACE + ".h5")
    t = c.traces[TIMELINE_TRACE]
    for step in (None, 1):
        out = os.path.join(c.out, f"trace-{step}.json")
        cmd = [sys.executable, "-m", "analysis.perfetto", path, "-o", out] + ([] if step is None else ["--step", str(step)])
        p = subprocess.run(cmd, cwd=c.source, capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, f"{cmd}: {p.stderr}")
        with open(out) as f:
            obj = json.load(f)
        events = obj["traceEvents"]
        spans = t.spans if step is None else t.spans_where(step=step)
        x = [e for e in events if e["ph"] == "X"]
        check(len(x) == len(spans), f"{len(x)} X events, {len(spans)} spans (step {step})")
        check({e["pid"] for e in events} == set(range(t.world_size)), f"pids {sorted({e['pid'] for e in events})}")
        for rank in range(t.world_size):
            n = sum(1 for e in x if e["pid"] == rank)
            check(n == int(np.sum(spans["rank"] == rank)), f"rank {rank}: {n} events")
        names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
        check(len(names) == t.world_size, f"{len(names)} process_name events")
        # ts/dur are the spans' µs, unchanged; tid is the phase group.
        got = sorted((e["pid"], e["ts"], e["dur"], e["name"]) for e in x)
        want = sorted((int(s["rank"]), float(s["t_begin_us"]), float(s["t_end_us"] - s["t_begin_us"]), t.phase_name(s["phase"]))
                      for s in spans)
        check(got == want, "X events differ from the spans")
        for e in x:
            check(e["tid"] == c.perfetto.GROUP_TID[c.tables.phase_group(e["name"])], f"tid of {e['name']}")
            check(e["dur"] >= 0, "negative duration")


def case_cli(c: Ctx):
    out = os.path.join(c.out, "figures")
    cmd = [sys.executable, "-m", "analysis.figures", c.tdir, "-o", out, "--timeline",
           os.path.join(c.tdir, TIMELINE_TRACE + ".h5")]
    p = subprocess.run(cmd, cwd=c.source, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"{cmd}: {p.returncode}\n{p.stderr}")
    for stem in ("mfu_vs_seq", "exposed_comm", "scaling", "timeline"):
        check_png(os.path.join(out, stem + ".png"))
        check(os.path.join(out, stem + ".csv") in p.stdout, f"{stem}.csv not reported")
    header, rows = read_csv(os.path.join(out, "runs.csv"))
    check(len(rows) == len(TRACES), f"runs.csv has {len(rows)} rows")
    _h, tl = read_csv(os.path.join(out, "timeline.csv"))
    check(len(tl) == len(c.traces[TIMELINE_TRACE].spans_where(step=1)), "CLI timeline rows")
    empty = os.path.join(c.out, "empty")
    os.makedirs(empty)
    p = subprocess.run([sys.executable, "-m", "analysis.figures", empty, "-o", out], cwd=c.source,
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 2 and "no ctxpar traces" in p.stderr, f"empty dir: rc {p.returncode}, {p.stderr!r}")


def case_summary(c: Ctx):
    """analysis.summary on a directory: one row per file, in the text table (two header rows) and in
    --csv; files that cannot be read (HDF5 that is not a trace, garbage, a truncated copy) get a row
    that says so; numbers as analysis/tables.py computes them; an empty directory is an error."""
    d = os.path.join(c.out, "dir")
    shutil.copytree(c.tdir, d)
    with open(os.path.join(d, "garbage.h5"), "wb") as f:
        f.write(b"not an HDF5 file\n" * 10)
    os.makedirs(os.path.join(d, "sub"))
    with open(os.path.join(c.tdir, "train-ring-p2.h5"), "rb") as f:
        head = f.read(4096)
    with open(os.path.join(d, "sub", "cut.h5"), "wb") as f:
        f.write(head)
    bad = {"garbage", "not-a-trace", "sub/cut"}
    names = sorted(set(TRACES) | bad)
    cmd = [sys.executable, "-m", "analysis.summary", d]
    p = subprocess.run(cmd, cwd=c.source, capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"{cmd}: rc {p.returncode}\n{p.stdout}\n{p.stderr}")
    lines = p.stdout.splitlines()
    head_at = [i for i, ln in enumerate(lines) if ln.startswith("# run ")]
    check(len(head_at) == 1 and lines[head_at[0] + 1].startswith("#"), f"no header and units rows:\n{p.stdout}")
    rows = [ln for ln in lines if not ln.startswith("#")]
    check(sorted(r.split()[0] for r in rows) == names, f"rows {[r.split()[0] for r in rows]}, expected {names}")
    for r in rows:
        name = r.split()[0]
        check(("unreadable:" in r) == (name in bad), f"row of {name}: {r}")
        check(name in bad or r.endswith(" complete"), f"row of {name}: {r}")
    p = subprocess.run(cmd + ["--csv"], cwd=c.source, capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"--csv: rc {p.returncode}\n{p.stderr}")
    table = list(csv.DictReader(p.stdout.splitlines()))
    check(sorted(r["run"] for r in table) == names, f"CSV rows {[r['run'] for r in table]}")
    by = {r["run"]: r for r in table}
    for name in bad:
        check(by[name]["status"].startswith("unreadable: ") and by[name]["step_ms"] == "", f"CSV {by[name]}")
    want = {r["run"]: r for r in c.runs()}
    for name, (np_, _a) in TRACES.items():
        r, w, t = by[name], want[name], c.traces[name]
        check(int(r["ranks"]) == np_ and r["status"] == "complete", f"CSV {r}")
        check(int(r["steps"]) == len(t.measured_steps()) and int(r["warmup"]) == t.warmup_steps(), f"CSV steps {r}")
        check(close(float(r["step_ms"]), 1e3 * w["time_s"]), f"{name}: step_ms {r['step_ms']}")
        check(close(float(r["exposed_ms"]), 1e3 * w["exposed_comm_s"]), f"{name}: exposed_ms {r['exposed_ms']}")
        check(close(float(r["tflops"]), w["tflops_per_rank"]), f"{name}: tflops {r['tflops']}")
        trains = name.startswith("train")
        check((r["loss"] != "") == trains and (r["mfu_pct"] != "") == trains, f"{name}: loss/MFU {r}")
        if trains:
            check(float(r["loss"]) == float(t.measured_steps()["loss"][-1]), f"{name}: loss {r['loss']}")
            check(close(float(r["mfu_pct"]), 100 * w["mfu"]), f"{name}: mfu {r['mfu_pct']}")
            check(close(float(r["peak_gflops"]), float(t.attrs["peak_flops_per_rank"]) / 1e9), f"{name}: peak")
    # One file: the steps table, as before.
    p = subprocess.run([sys.executable, "-m", "analysis.summary", os.path.join(d, "train-ring-p2.h5")],
                       cwd=c.source, capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and "status complete" in p.stdout and "# summary: medians" in p.stdout,
          f"single file: {p.stdout}{p.stderr}")
    empty = os.path.join(c.out, "empty")
    os.makedirs(empty)
    p = subprocess.run([sys.executable, "-m", "analysis.summary", empty], cwd=c.source,
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 2 and "no traces" in p.stderr, f"empty dir: rc {p.returncode}, {p.stderr!r}")


CASES = {"loader": case_loader, "mfu": case_mfu, "exposed": case_exposed, "scaling": case_scaling,
         "timeline": case_timeline, "perfetto": case_perfetto, "cli": case_cli, "summary": case_summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-traces", action="store_true")
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--ctxpar")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--source", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    if args.make_traces:
        make_traces(args)
        return 0
    CASES[args.case](Ctx(args))
    print(f"ok: analysis {args.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
