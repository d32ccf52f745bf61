"""Figures of ctxpar runs: PNG (matplotlib, Agg backend) with the plotted data as CSV beside it.

    /usr/bin/python3 -m analysis.figures out/sweep -o out/figures    (from the repository root)

draws, from every trace under the given files/directories:
  mfu_vs_seq      TFLOP/s per rank and MFU vs global sequence length, a line per strategy
  exposed_comm    exposed-communication fraction (exposed_comm_s / time_s) vs sequence length
  scaling         strong and weak scaling efficiency vs rank count (runs at >= 2 rank counts)
  timeline        a per-rank timeline of one step: compute, communication and waiting (/spans)

Each figure function takes a table (analysis/tables.py: a list of dict rows) and an output PNG
path, writes NAME.png and NAME.csv (exactly the plotted rows), and returns both paths; so the
same functions draw tables that do not come from traces. Not here yet (they come with the
inference and cost-model work): pass-KV vs pass-Q over the KV-cache miss rate, and predicted vs
measured step time; both will be functions of the same form over their own tables.

MFU needs a peak FLOP/s: `ctxpar train` records one (peak_tflops_per_rank, which a local
jobs/sweep.py sets once for all its runs, else one core's FMA loop x the rank's threads, measured
by that run); `ctxpar run` does not, so its MFU is left out (NaN in the CSV) unless
--peak-tflops-per-rank is given here.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a script: make `analysis` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only; no display on cluster nodes or CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import numpy as np  # noqa: E402

from analysis import tables  # noqa: E402
from analysis.tables import Row, write_csv  # noqa: E402

GROUP_COLORS = {"compute": "#4c72b0", "comm": "#dd8452", "wait": "#c44e52", "other": "#8c8c8c"}
DPI = 120

MFU_COLUMNS = ("mode", "strategy", "ranks", "seq", "tflops_per_rank", "mfu", "time_s", "traces")
EXPOSED_COLUMNS = ("mode", "strategy", "ranks", "seq", "exposed_comm_s", "time_s", "exposed_comm_frac", "traces")


def fmt_tokens(n: float) -> str:
    n = int(n)
    for div, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def _csv_path(png: str) -> str:
    return os.path.splitext(png)[0] + ".csv"


def _save(fig, png: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=DPI)
    plt.close(fig)


def _nanmedian(values) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(np.median(v)) if v.size else math.nan


def _by_seq(runs: Sequence[Row], value_cols: Sequence[str]) -> List[Row]:
    """Runs grouped by (mode, strategy, ranks, seq); each value the median over the group."""
    groups: Dict[tuple, List[Row]] = {}
    for r in runs:
        groups.setdefault((r["mode"], r["strategy"], int(r["ranks"]), int(r["seq"])), []).append(r)
    out = []
    for (mode, strategy, ranks, seq), sel in sorted(groups.items()):
        row = {"mode": mode, "strategy": strategy, "ranks": ranks, "seq": seq, "traces": len(sel)}
        for c in value_cols:
            row[c] = _nanmedian([s[c] for s in sel])
        out.append(row)
    return out


def _series(rows: Sequence[Row], key_cols: Sequence[str]) -> Dict[tuple, List[Row]]:
    out: Dict[tuple, List[Row]] = {}
    for r in rows:
        out.setdefault(tuple(r[c] for c in key_cols), []).append(r)
    return out


def _series_label(key: tuple, cols: Sequence[str], rows: Sequence[Row]) -> str:
    # Name only what differs between the series drawn (one mode -> no mode in the label).
    parts = []
    for c, v in zip(cols, key):
        if len({r[c] for r in rows}) > 1 or c == "strategy":
            parts.append(f"P={v}" if c == "ranks" else str(v))
    return " ".join(parts)


def _seq_axis(ax, seqs) -> None:
    seqs = sorted(set(int(s) for s in seqs))
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs)
    ax.set_xticklabels([fmt_tokens(s) for s in seqs])
    ax.minorticks_off()
    ax.set_xlabel("sequence length S (tokens)")


def _peak_note(runs: Sequence[Row]) -> str:
    """The MFU axis names its peak: one for every run (MFU then moves only with TFLOP/s), or the
    spread when runs divide by different peaks."""
    peaks = sorted({round(float(r["peak_tflops_per_rank"]), 9) for r in runs
                    if r.get("peak_tflops_per_rank") and not math.isnan(float(r["peak_tflops_per_rank"]))})
    if not peaks:
        return ""
    if len(peaks) == 1:
        return f" of {1e3 * peaks[0]:.4g} GFLOP/s per rank (every run)"
    return f"; peaks differ: {1e3 * peaks[0]:.4g}-{1e3 * peaks[-1]:.4g} GFLOP/s"


def fig_mfu_vs_seq(runs: Sequence[Row], png: str, title: str = "") -> Tuple[str, str]:
    """TFLOP/s per rank and MFU vs sequence length; a line per (mode, strategy, ranks).
    Input: tables.run_table rows (mode, strategy, ranks, seq, tflops_per_rank, mfu, time_s)."""
    data = _by_seq(runs, ("tflops_per_rank", "mfu", "time_s"))
    csv = write_csv(_csv_path(png), data, MFU_COLUMNS)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    key_cols = ("mode", "strategy", "ranks")
    for key, rows in sorted(_series(data, key_cols).items()):
        rows = sorted(rows, key=lambda r: r["seq"])
        label = _series_label(key, key_cols, data)
        x = [r["seq"] for r in rows]
        ax_t.plot(x, [r["tflops_per_rank"] for r in rows], marker="o", label=label)
        ax_m.plot(x, [100.0 * r["mfu"] for r in rows], marker="o", label=label)
    for ax in (ax_t, ax_m):
        if data:
            _seq_axis(ax, [r["seq"] for r in data])
        ax.grid(True, alpha=0.3)
    ax_t.set_ylabel("model TFLOP/s per rank")
    ax_m.set_ylabel("MFU (%)" + _peak_note(runs))
    if data and all(math.isnan(r["mfu"]) for r in data):
        ax_m.text(0.5, 0.5, "no peak FLOP/s in these traces\n(`ctxpar run`: pass --peak-tflops-per-rank)",
                  ha="center", va="center", transform=ax_m.transAxes, fontsize=9)
    if data:
        ax_t.legend(fontsize=8)
    fig.suptitle(title or "Throughput vs sequence length (FLOP convention of the traces; medians of measured steps)",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, png)
    return png, csv


def fig_exposed_comm(runs: Sequence[Row], png: str, title: str = "") -> Tuple[str, str]:
    """Exposed-communication fraction (time blocked on communication / step time, max over ranks
    per step, median over steps) vs sequence length; a line per (mode, strategy, ranks)."""
    data = _by_seq(runs, ("exposed_comm_s", "time_s", "exposed_comm_frac"))
    csv = write_csv(_csv_path(png), data, EXPOSED_COLUMNS)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    key_cols = ("mode", "strategy", "ranks")
    for key, rows in sorted(_series(data, key_cols).items()):
        rows = sorted(rows, key=lambda r: r["seq"])
        ax.plot([r["seq"] for r in rows], [100.0 * r["exposed_comm_frac"] for r in rows], marker="o",
                label=_series_label(key, key_cols, data))
    if data:
        _seq_axis(ax, [r["seq"] for r in data])
        ax.legend(fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("exposed communication (% of step time)")
    ax.grid(True, alpha=0.3)
    ax.set_title(title or "Communication not hidden by compute", fontsize=10)
    fig.tight_layout()
    _save(fig, png)
    return png, csv


def fig_scaling(scaling: Sequence[Row], png: str, title: str = "") -> Tuple[str, str]:
    """Strong (fixed S) and weak (fixed S/P) scaling efficiency vs ranks.
    Input: tables.scaling_table rows."""
    csv = write_csv(_csv_path(png), scaling, tables.SCALING_COLUMNS)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, kind, size_col in ((axes[0], "strong", "seq"), (axes[1], "weak", "tokens_per_rank")):
        rows = [r for r in scaling if r["kind"] == kind]
        key_cols = ("mode", "strategy", "model", size_col)
        ranks_all = sorted({int(r["ranks"]) for r in rows})
        for key, ser in sorted(_series(rows, key_cols).items()):
            ser = sorted(ser, key=lambda r: r["ranks"])
            label = _series_label(key[:3], key_cols[:3], rows)
            label += f" S={fmt_tokens(key[3])}" if kind == "strong" else f" S/P={fmt_tokens(key[3])}"
            ax.plot([r["ranks"] for r in ser], [r["efficiency"] for r in ser], marker="o", label=label)
        if ranks_all:
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xticks(ranks_all)
            ax.set_xticklabels([str(p) for p in ranks_all])
            ax.minorticks_off()
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no series with two or more rank counts", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9)
        ax.set_xlabel("ranks P")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("efficiency")
    axes[0].set_title("strong: T(P0)·P0 / (T(P)·P), same S", fontsize=9)
    axes[1].set_title("weak: FLOP/s per rank vs P0, same S/P", fontsize=9)
    fig.suptitle(title or "Scaling efficiency (base: smallest rank count of each series)", fontsize=10)
    fig.tight_layout()
    _save(fig, png)
    return png, csv


def fig_timeline(timeline: Sequence[Row], png: str, title: str = "") -> Tuple[str, str]:
    """Per-rank timeline of one step: a lane per phase group (compute, comm, wait, other) under
    each rank; bars from span begin to end, in ms from the step's first span.
    Input: tables.timeline_table rows."""
    csv = write_csv(_csv_path(png), timeline, tables.TIMELINE_COLUMNS)
    ranks = sorted({int(r["rank"]) for r in timeline})
    groups = [g for g in tables.GROUP_ORDER if any(r["group"] == g for r in timeline)]
    lane_h = 1.0 / (len(groups) + 0.5) if groups else 1.0
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.9 * max(1, len(ranks))))
    for rank in ranks:
        for gi, g in enumerate(groups):
            bars = [(r["begin_us"] / 1e3, max(r["duration_us"], 0.0) / 1e3) for r in timeline
                    if r["rank"] == rank and r["group"] == g]
            if bars:
                y = rank - 0.5 + 0.25 * lane_h + gi * lane_h
                ax.broken_barh(bars, (y, lane_h * 0.9), facecolors=GROUP_COLORS[g], edgecolor="none")
    ax.set_yticks(ranks)
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5 if ranks else 0.5, -0.5)  # rank 0 on top
    ax.set_xlabel("time in step (ms, rank 0's clock)")
    if groups:
        ax.legend(handles=[Patch(color=GROUP_COLORS[g], label=g) for g in groups],
                  loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, ncol=len(groups), frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    step = timeline[0]["step"] if timeline else "?"
    ax.set_title(title or f"step {step}: compute, communication and waiting per rank", fontsize=10, loc="left")
    fig.tight_layout()
    _save(fig, png)
    return png, csv


def pick_timeline_trace(traces):
    """The trace drawn as a timeline when none is named: most ranks, then longest sequence."""
    with_spans = [t for t in traces if len(t.spans) > 0]
    if not with_spans:
        return None
    return max(with_spans, key=lambda t: (t.world_size, int(t.config.get("seq", 0)), tables.run_label(t)))


def make_all(paths: Sequence[str], out_dir: str, timeline_trace: Optional[str] = None,
             step: Optional[int] = None, peak_tflops_per_rank: Optional[float] = None) -> List[str]:
    """Every figure from the traces under `paths` into `out_dir`; returns the files written."""
    traces = tables.load_traces(paths)
    if not traces:
        raise FileNotFoundError(f"no ctxpar traces under {', '.join(paths)}")
    runs = tables.run_table(traces, peak_tflops_per_rank)
    written: List[str] = []
    written += fig_mfu_vs_seq(runs, os.path.join(out_dir, "mfu_vs_seq.png"))
    written += fig_exposed_comm(runs, os.path.join(out_dir, "exposed_comm.png"))
    written += fig_scaling(tables.scaling_table(runs), os.path.join(out_dir, "scaling.png"))
    t = tables.load_traces([timeline_trace])[0] if timeline_trace else pick_timeline_trace(traces)
    if t is not None:
        tl = tables.timeline_table(t, step)
        written += fig_timeline(tl, os.path.join(out_dir, "timeline.png"),
                                title=f"{tables.run_label(t)}: step {tl[0]['step']} "
                                      f"({t.attrs.get('mode', '?')}, {t.attrs.get('strategy', '?')}, "
                                      f"P={t.world_size}, S={fmt_tokens(t.config.get('seq', 0))})")
    written.append(write_csv(os.path.join(out_dir, "runs.csv"), runs, tables.RUN_COLUMNS))
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="trace files and/or directories (searched for *.h5)")
    p.add_argument("-o", "--out", default="out/figures", help="output directory (default out/figures)")
    p.add_argument("--timeline", help="trace for the timeline (default: most ranks, longest sequence)")
    p.add_argument("--step", type=int, help="step of the timeline (default: first measured step)")
    p.add_argument("--peak-tflops-per-rank", type=float,
                   help="peak for MFU of traces that recorded none (e.g. `ctxpar run`)")
    args = p.parse_args(argv)
    try:
        files = make_all(args.paths, args.out, args.timeline, args.step, args.peak_tflops_per_rank)
    except (FileNotFoundError, ValueError, tables.ctxpar_trace.TraceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for f in files:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
