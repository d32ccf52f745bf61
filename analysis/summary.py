"""Prints a ctxpar trace's provenance, its steps table and its summary; or, for a directory, one row
per run (a sweep directory of jobs/sweep.py, or any directory holding traces one or two levels deep).

    /usr/bin/python3 -m analysis.summary out/train.h5     (from the repository root)
    /usr/bin/python3 analysis/summary.py out/train.h5
    /usr/bin/python3 -m analysis.summary runs/sweep1 [--csv]   # one row per run: loss, step time, ...

The per-run table: the last measured (non-warmup) step's loss; medians over the measured steps of
the step time, tokens/s, exposed communication, TFLOP/s per rank and MFU; the MFU peak the trace
records (GFLOP/s per rank; MFU compares only between rows with the same peak); the largest tracked
memory of any step; the status the trace records (complete, truncated, failed; "running" for the
.partial of a run that never finished). A file that cannot be read gives a row that says why.
Under the table, train runs with the same configuration apart from strategy and mesh (they compute
the same math) are compared step by step: their losses' largest relative spread, against the 2e-5
the tests hold strategies and meshes to (tests/README.md, "mesh invariance").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np

if __package__ in (None, ""):  # run as a script: make `analysis` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis import ctxpar_trace, tables  # noqa: E402

MiB = 1024.0 * 1024.0


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def steps_table(t: ctxpar_trace.Trace, csv: bool = False) -> str:
    """The /steps rows, warmup rows marked with 'w'."""
    cols = [("step", "", "d"), ("time_s", "s", ".6g"), ("tokens", "", "d"),
            ("tflops_per_rank", "TFLOP/s", ".4f"), ("mfu", "", ".4f"),
            ("exposed_comm_s", "s", ".6g"), ("peak_bytes", "MiB", ".1f"),
            ("peak_rss_bytes", "MiB", ".1f"), ("loss", "", ".5f")]
    inference = bool((t.steps["turn"] >= 0).any()) if len(t.steps) else False
    if inference:
        cols += [("turn", "", "d"), ("ttft_s", "s", ".6f"), ("ttit_s", "s", ".6f")]
    warm = t.warmup_steps()
    lines = []
    if csv:
        lines.append(",".join(["warmup"] + [c[0] for c in cols]))
    else:
        lines.append("#    " + " ".join(f"{c[0]:>15}" for c in cols))
        lines.append("#    " + " ".join(f"{'(' + c[1] + ')' if c[1] else '':>15}" for c in cols))
    for i, row in enumerate(t.steps):
        vals = []
        for name, unit, spec in cols:
            v = row[name]
            v = v / MiB if unit == "MiB" else v
            vals.append(_fmt(int(v) if spec == "d" else float(v), spec))
        mark = "w" if i < warm else ""
        if csv:
            lines.append(",".join([str(int(i < warm))] + vals))
        else:
            lines.append(f"{mark:>4} " + " ".join(f"{v:>15}" for v in vals))
    return "\n".join(lines)


def describe(t: ctxpar_trace.Trace) -> str:
    a = t.attrs
    dirty = {1: " (dirty)", 0: "", -1: " (dirty: unknown)"}.get(a.get("git_dirty", -1), "")
    hosts = a.get("hostnames", [])
    out = [
        f"# ctxpar trace {t.path}",
        f"# status {t.status}, {t.steps_completed} steps completed, schema {t.schema_version}"
        + (" (unfinished run: .partial)" if t.partial else ""),
        f"# mode {a.get('mode', '?')}, strategy {a.get('strategy', '?')}, mesh '{a.get('mesh', '')}', "
        f"{t.world_size} ranks on {len(hosts)} host(s)",
        f"# ctxpar {a.get('ctxpar_version', '?')} git {a.get('git_sha', '?')}{dirty}, "
        f"{a.get('build_type', '?')}, {a.get('cxx_compiler', '?')}; BLAS {a.get('blas', '?')}; "
        f"HDF5 {a.get('hdf5_version', '?')}",
        f"# started {a.get('start_time_utc', '?')}; FLOP convention: {a.get('flop_convention', '?')}",
    ]
    if a.get("peak_flops_per_rank", 0) <= 0:
        out.append("# MFU is 0: " + str(a.get("mfu_note", "no peak FLOP/s given")))
    return "\n".join(out)


def summary_lines(t: ctxpar_trace.Trace) -> str:
    s = t.summary
    if not s:
        return "# no /summary (run did not finish); warmup rows are marked 'w'"
    verdict = "VALID" if s.get("valid") else f"INVALID ({s.get('valid_reason', '')})"
    return (
        f"# summary: medians over {s['measured_steps']} measured steps "
        f"({s['warmup_steps_excluded']} warmup excluded): time {s['time_s_median']:.6f} s, "
        f"{s['tflops_per_rank_median']:.4f} TFLOP/s/rank, MFU {s['mfu_median']:.4f}, "
        f"exposed comm {s['exposed_comm_s_median']:.6f} s, peak {s['peak_bytes_max'] / MiB:.1f} MiB "
        f"tracked / {s['peak_rss_bytes_max'] / MiB:.1f} MiB RSS — {verdict}")


# ---- a directory: one row per run ---------------------------------------------------------------

# (key, header, unit, format); a row is a dict with these keys (None: not applicable, printed '-').
RUN_COLS = [("run", "run", "", "s"), ("mode", "mode", "", "s"), ("strategy", "strategy", "", "s"),
            ("mesh", "mesh", "", "s"), ("ranks", "ranks", "", "d"), ("seq", "seq", "tokens", "d"),
            ("steps", "steps", "+warmup", "s"), ("loss", "loss", "last", ".6f"),
            ("step_ms", "step_time", "ms", ".2f"), ("tokens_per_s", "tokens/s", "", ".1f"),
            ("exposed_ms", "exposed_comm", "ms/step", ".2f"), ("tflops", "TFLOP/s", "per rank", ".4f"),
            ("mfu_pct", "MFU", "%", ".2f"), ("peak_gflops", "peak/rank", "GFLOP/s", ".1f"),
            ("peak_mib", "peak_mem", "MiB", ".1f"), ("status", "status", "", "s")]

# CSV: the same columns, steps split into measured steps and warmup steps, numbers unrounded.
CSV_COLS = [c[0] for c in RUN_COLS[:7]] + ["warmup"] + [c[0] for c in RUN_COLS[7:]]

# Config keys that may differ between runs computing the same math (what a sweep varies, and
# settings that change no number of the model): the loss comparison groups on every other key.
SAME_MATH_IGNORED = ("strategy", "mesh", "out", "peak_tflops_per_rank", "threads", "watchdog_s", "csv")
LOSS_RTOL = 2e-5  # tests/README.md "mesh invariance": losses of 5 steps, every strategy and mesh


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _compact_mesh(mesh: str) -> str:
    """'dp:1,tp:1,ulysses:2,ring:2' -> 'ulysses:2,ring:2' (axes of size 1 dropped; '1' if all are)."""
    axes = [a for a in str(mesh).split(",") if a and not a.endswith(":1")]
    return ",".join(axes) or ("1" if mesh else "?")


def find_runs(d: str) -> Tuple[List[Tuple[str, Optional[str], str, Dict]], List[str]]:
    """The runs of directory d as (name, trace path or None, run directory or '', what the sweep
    planned: mode, strategy, mesh, ranks, seq where sweep.json says), in order, and
    notes on files skipped. A sweep directory (sweep.json or runs.txt) lists its runs, also those
    that left no trace; any other directory: every NAME.h5 / NAME.h5.partial in it and in its
    subdirectories (one level), except ctxpar files that are not traces (checkpoints, ...)."""
    run_dirs: List[Tuple[str, str, Dict]] = []
    try:
        with open(os.path.join(d, "sweep.json")) as f:
            sweep = json.load(f)
        run_dirs = [(r["name"], r["dir"], {"mode": sweep.get("mode"), "strategy": r.get("strategy"),
                                           "mesh": _compact_mesh(r.get("mesh", "")), "ranks": r.get("ranks"),
                                           "seq": r.get("seq")}) for r in sweep["runs"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        lines = [ln for ln in _read(os.path.join(d, "runs.txt")).splitlines() if ln.strip()]
        run_dirs = [(os.path.basename(ln.rstrip("/")), ln.strip(), {}) for ln in lines]
    if run_dirs:
        runs = []
        for name, rd, planned in run_dirs:
            if os.path.isdir(os.path.join(d, name)):
                rd = os.path.join(d, name)  # sweep.py's layout, also for a sweep moved or copied
            try:
                path = ctxpar_trace.resolve_path(os.path.join(rd, "trace.h5"))
            except FileNotFoundError:
                path = None
            runs.append((name, path, rd, planned))
        return runs, []
    found: Dict[str, str] = {}  # NAME.h5 -> the file to read (NAME.h5, else NAME.h5.partial)
    for path in tables.find_trace_files([d]):
        if os.path.relpath(path, d).count(os.sep) <= 1 and os.path.isfile(path):  # d and its subdirectories
            found[path[:-len(".partial")] if path.endswith(".partial") else path] = path
    runs, skipped = [], []
    for base in sorted(found):
        rel = os.path.relpath(base, d)[:-len(".h5")]
        if os.path.basename(rel) == "trace" and os.path.dirname(rel):
            rel = os.path.dirname(rel)  # RUN/trace.h5 (a run directory): the run's name
        kind = _ctxpar_kind(found[base])
        if kind not in (None, "trace"):
            skipped.append(f"{os.path.relpath(found[base], d)} ({kind})")
            continue
        runs.append((rel, found[base], "", {}))
    return runs, skipped


def _ctxpar_kind(path: str) -> Optional[str]:
    """The ctxpar_file attribute of an HDF5 file (None where unreadable or absent)."""
    try:
        with ctxpar_trace._open(path) as f:
            v = ctxpar_trace._py(f.attrs.get("ctxpar_file"))
            return v if isinstance(v, str) else None
    except Exception:
        return None


def run_row(name: str, path: Optional[str], run_dir: str = "", planned: Optional[Dict] = None) -> Dict:
    """One row of the runs table; a run without a readable trace gets a row that says why (and,
    for a sweep's run, what the sweep planned: mode, strategy, mesh, ranks, seq)."""
    row: Dict = {c[0]: None for c in RUN_COLS}
    row.update(planned or {})
    row.update(run=name, warmup=None, losses=[], group=None)
    code = _read(os.path.join(run_dir, "exit_code")) if run_dir else ""
    if path is None:
        row["status"] = (f"no trace (exit code {code}; see {os.path.join(run_dir, 'job.out')})" if code
                         else "no trace (not run, or still starting)")
        return row
    try:
        t = ctxpar_trace.load(path)
        a, cfg, s = t.attrs, t.config, t.summary
        mode = str(a.get("mode", "?"))
        if mode == "bench" and a.get("bench"):
            mode = f"bench {a['bench']}"
        m = t.measured_steps()
        warm = t.warmup_steps()
        row.update(mode=mode, strategy=str(a.get("strategy", "?")), mesh=_compact_mesh(a.get("mesh", "")),
                   ranks=t.world_size, seq=cfg.get("seq"),
                   steps=len(m), warmup=warm)
        losses = np.asarray(t.steps["loss"], dtype=float)
        trains = "train" in mode and bool(np.any(losses != 0))
        if trains and len(m) and math.isfinite(float(m["loss"][-1])):
            row["loss"] = float(m["loss"][-1])
        if len(m):  # the medians of analysis/tables.py (the figures' runs.csv), over the measured steps
            tr = tables.run_row(t)
            rate = np.where(m["time_s"] > 0, m["tokens"] / np.where(m["time_s"] > 0, m["time_s"], 1), np.nan)
            row.update(step_ms=tr["time_s"] * 1e3, exposed_ms=tr["exposed_comm_s"] * 1e3,
                       tflops=tr["tflops_per_rank"], mfu_pct=tr["mfu"] * 100,
                       tokens_per_s=float(np.nanmedian(rate)) if np.any(np.isfinite(rate)) else None)
        if len(t.steps):  # the run's peak: every step, warmup included (as /summary's peak_bytes_max)
            row["peak_mib"] = float(np.max(t.steps["peak_bytes"])) / MiB
        peak = float(a.get("peak_flops_per_rank", 0) or 0)
        if peak > 0:
            row["peak_gflops"] = peak / 1e9
        status = t.status + (" (.partial)" if t.partial else "")
        if s and not s.get("valid", True):
            status += f", INVALID ({s.get('valid_reason', '')})"
        if code and code != "0":
            status += f", exit code {code}"
        row["status"] = status
        if trains:
            row["losses"] = [float(x) for x in losses]
            row["group"] = (mode, json.dumps({k: v for k, v in sorted(cfg.items()) if k not in SAME_MATH_IGNORED},
                                             default=str))
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = None
    except Exception as e:  # any file in the directory: a row, never a crash
        msg = str(e) or type(e).__name__
        for prefix in (path + ": ", os.path.abspath(path) + ": "):
            msg = msg.replace(prefix, "")
        row["status"] = f"unreadable: {msg}"
    return row


def _cell(row: Dict, key: str, spec: str) -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if key == "steps":
        return f"{v}+{row['warmup']}" if row.get("warmup") else str(v)
    if spec == "s":
        return str(v)
    return format(int(v) if spec == "d" else float(v), spec)


def runs_table(rows: List[Dict], csv: bool = False) -> str:
    """The rows as an aligned table (names, then units, as two header rows) or as CSV."""
    if csv:
        import csv as csvmod
        import io
        buf = io.StringIO()
        w = csvmod.writer(buf, lineterminator="\n")
        w.writerow(CSV_COLS)
        for r in rows:  # full precision; empty where not applicable
            w.writerow(["" if r.get(k) is None else repr(r[k]) if isinstance(r[k], float) else r[k]
                        for k in CSV_COLS])
        return buf.getvalue().rstrip("\n")
    head = [c[1] for c in RUN_COLS]
    units = [f"({c[2]})" if c[2] else "" for c in RUN_COLS]
    body = [[_cell(r, k, spec) for k, _, _, spec in RUN_COLS] for r in rows]
    last = len(RUN_COLS) - 1  # status: free text, left-aligned, not padded
    width = [max(len(x[i]) for x in [head, units] + body) for i in range(len(RUN_COLS))]

    def line(cells: List[str], lead: str) -> str:
        out = []
        for i, c in enumerate(cells):
            left = RUN_COLS[i][3] == "s" and i < 4
            out.append(c if i == last else (c.ljust(width[i]) if left else c.rjust(width[i])))
        return (lead + "  ".join(out)).rstrip()
    return "\n".join([line(head, "# "), line(units, "# ")] + [line(b, "  ") for b in body])


def loss_agreement(rows: List[Dict]) -> List[str]:
    """Train runs with the same configuration apart from strategy and mesh compute the same math:
    their losses, step by step, and the largest relative spread against LOSS_RTOL."""
    groups: Dict[Tuple, List[Dict]] = {}
    for r in rows:
        if r.get("group") and r.get("losses"):
            groups.setdefault(r["group"], []).append(r)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        n = min(len(r["losses"]) for r in members)
        worst, at = 0.0, 0
        for i in range(n):
            ls = [r["losses"][i] for r in members]
            ref = max(abs(x) for x in ls) or 1.0
            spread = (max(ls) - min(ls)) / ref
            if not math.isfinite(spread):
                spread = math.inf
            if spread > worst:
                worst, at = spread, i
        kinds: Dict[str, int] = {}
        for r in members:
            kinds[f"{r['strategy']} {r['mesh']}"] = kinds.get(f"{r['strategy']} {r['mesh']}", 0) + 1
        names = ", ".join(k + (f" x{c}" if c > 1 else "") for k, c in kinds.items())
        steps = "step 0" if n == 1 else f"steps 0-{n - 1}"
        agree = ("are bit-identical" if worst == 0 else
                 f"agree to a relative {worst:.1e} (largest at step {at})")
        verdict = (f"within the {LOSS_RTOL:g} the tests hold strategies and meshes to"
                   if worst <= LOSS_RTOL else
                   f"MORE than the {LOSS_RTOL:g} the tests hold strategies and meshes to (for 5 steps; "
                   "rounding differences grow over many AdamW steps)")
        out.append(f"# same model and data, {len(members)} train runs ({names}): losses of {steps} "
                   f"{agree}, {verdict} (tests/README.md, mesh invariance)")
    peaks = {round(r["peak_gflops"], 6) for r in rows if r.get("peak_gflops")}
    if len(peaks) > 1:
        out.append("# the rows' MFU peaks differ: compare MFU only between rows with the same peak/rank "
                   "(TFLOP/s compares across all)")
    return out


def directory_report(d: str, csv: bool = False) -> Tuple[str, int]:
    """The runs table of directory d (and the loss comparison, not in CSV), and how many rows."""
    runs, skipped = find_runs(d)
    rows = [run_row(*r) for r in runs]
    if csv:
        return runs_table(rows, csv=True), len(rows)
    lines = [f"# {len(rows)} run(s) in {d}: medians over the measured (non-warmup) steps; loss: the last "
             "measured step's"]
    if rows:
        lines.append(runs_table(rows))
    lines += loss_agreement(rows)
    if skipped:
        lines.append(f"# skipped {len(skipped)} ctxpar file(s) that are not traces: " + ", ".join(skipped[:3])
                     + (", ..." if len(skipped) > 3 else ""))
    return "\n".join(lines), len(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="NAME.h5 (or NAME.h5.partial), or a directory: one row per run")
    p.add_argument("--csv", action="store_true", help="steps table (a directory: the runs table) as CSV only")
    args = p.parse_args(argv)
    if os.path.isdir(args.trace):
        text, n = directory_report(args.trace, csv=args.csv)
        if n == 0:
            print(f"error: no traces in {args.trace} (NAME.h5 one or two levels deep, or a sweep's runs)",
                  file=sys.stderr)
            return 2
        print(text)
        return 0
    try:
        t = ctxpar_trace.load(args.trace)
    except (ctxpar_trace.TraceError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.csv:
        print(steps_table(t, csv=True))
        return 0
    print(describe(t))
    print(steps_table(t))
    print(summary_lines(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
