"""Prints a ctxpar trace's provenance, its steps table and its summary.

    /usr/bin/python3 -m analysis.summary out/train.h5     (from the repository root)
    /usr/bin/python3 analysis/summary.py out/train.h5
"""

from __future__ import annotations

import argparse
import math
import os
import sys

if __package__ in (None, ""):  # run as a script: make `analysis` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis import ctxpar_trace  # noqa: E402

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="NAME.h5 (or NAME.h5.partial)")
    p.add_argument("--csv", action="store_true", help="steps table as CSV only")
    args = p.parse_args(argv)
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
