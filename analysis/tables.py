"""Tables derived from ctxpar traces: the only input of the figure functions in analysis/figures.py.

A table is a list of rows, each a dict with the same keys, so a figure can be drawn from traces,
from a CSV written earlier, or from numbers that are not traces at all (published numbers, the
cost model's predictions). Traces are read only through analysis/ctxpar_trace.py.

    traces = tables.load_traces(["out/sweep"])           # every trace under the directory
    runs   = tables.run_table(traces)                     # a row per trace (medians of measured steps)
    tl     = tables.timeline_table(traces[0], step=None)  # a row per span of one step
    sc     = tables.scaling_table(runs)                   # strong and weak scaling efficiency

Medians are over the measured steps (warmup rows excluded, as in /summary); an unfinished
(.partial) trace contributes the steps it flushed.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

if __package__ in (None, ""):  # imported from a script outside the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis import ctxpar_trace  # noqa: E402

Row = Dict[str, object]

# Phase groups of the timeline and the Perfetto export. "wait" is time blocked on a transfer that
# was started earlier (ring's comm_wait): the part of communication that compute did not hide.
# "comm" is time inside a communication call (collectives, posting send/recv, the comm bench).
PHASE_GROUPS = {
    "compute": ("attn_fwd", "attn_bwd", "gemm", "norm", "rope", "mlp", "loss", "optimizer", "embed", "shard"),
    "comm": ("comm_send_recv", "all_to_all", "all_gather", "reduce_scatter", "all_reduce", "state_gather", "state_reduce", "bench"),
    "wait": ("comm_wait",),
}
GROUP_ORDER = ("compute", "comm", "wait", "other")


def phase_group(phase: str) -> str:
    for group, phases in PHASE_GROUPS.items():
        if phase in phases:
            return group
    return "other"


# ---------------------------------------------------------------------------------------------
# Finding and loading traces


def find_trace_files(paths: Iterable[str]) -> List[str]:
    """Trace files named by `paths`: files as given, directories searched recursively for *.h5
    (and *.h5.partial where the finished file is absent). Sorted, no duplicates."""
    found = []
    for p in paths:
        if os.path.isdir(p):
            for root, _dirs, files in os.walk(p):
                for name in files:
                    full = os.path.join(root, name)
                    if name.endswith(".h5"):
                        found.append(full)
                    elif name.endswith(".h5.partial") and not os.path.exists(full[: -len(".partial")]):
                        found.append(full)
        else:
            found.append(p)
    return sorted(set(found))


def load_traces(paths: Iterable[str], warn=sys.stderr) -> List[ctxpar_trace.Trace]:
    """Loads every trace under `paths`. A named file that is not a trace is an error; a file found
    by searching a directory that is not a ctxpar trace (e.g. `ctxpar attn` tensor results, a
    checkpoint) is skipped with a note on `warn`."""
    paths = list(paths)
    explicit = {os.path.normpath(p) for p in paths if not os.path.isdir(p)}
    traces = []
    for f in find_trace_files(paths):
        try:
            traces.append(ctxpar_trace.load(f))
        except ctxpar_trace.TraceError as e:
            if os.path.normpath(f) in explicit:
                raise
            if warn is not None:
                print(f"note: skipping {f}: {e}", file=warn)
    return traces


# ---------------------------------------------------------------------------------------------
# One row per trace


def _median(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    return float(np.median(values)) if values.size else math.nan


def run_label(t: ctxpar_trace.Trace) -> str:
    """Name of the run: its directory for a sweep's `RUN/trace.h5`, else the file name."""
    base = os.path.basename(t.path)
    if base.startswith("trace.h5"):
        return os.path.basename(os.path.dirname(os.path.abspath(t.path)))
    return base.split(".h5")[0]


RUN_COLUMNS = ("run", "path", "status", "mode", "strategy", "ranks", "nodes", "mesh", "seq",
               "tokens_per_rank", "heads", "kv_heads", "head_dim", "layers", "dim",
               "measured_steps", "time_s", "tokens", "model_flops", "tflops_per_rank",
               "peak_tflops_per_rank", "mfu", "exposed_comm_s", "exposed_comm_frac", "peak_bytes")


def run_row(t: ctxpar_trace.Trace, peak_tflops_per_rank: Optional[float] = None) -> Row:
    """A trace reduced to one row: configuration and medians over its measured steps.

    mfu is the trace's own (model FLOPs / (time x peak x ranks)) when the run recorded a peak
    FLOP/s; when it did not (e.g. `ctxpar run`), mfu is NaN unless `peak_tflops_per_rank` is
    given, in which case mfu = tflops_per_rank / peak (the same definition)."""
    steps = t.measured_steps()
    if len(steps) == 0:  # only warmup rows flushed: better a noisy number than none
        steps = t.steps
    cfg = t.config
    ranks = t.world_size
    seq = int(cfg.get("seq", 0))
    tflops = _median(steps["tflops_per_rank"])
    trace_peak_tflops = float(t.attrs.get("peak_flops_per_rank", 0.0)) / 1e12
    if peak_tflops_per_rank is not None and peak_tflops_per_rank > 0:
        peak, mfu = peak_tflops_per_rank, tflops / peak_tflops_per_rank
    elif trace_peak_tflops > 0:
        peak, mfu = trace_peak_tflops, _median(steps["mfu"])
    else:
        peak, mfu = math.nan, math.nan
    time_s = steps["time_s"].astype(np.float64)
    frac = np.where(time_s > 0, steps["exposed_comm_s"] / np.where(time_s > 0, time_s, 1.0), math.nan)
    node_id = t.topology.get("node_id")
    return {
        "run": run_label(t),
        "path": t.path,
        "status": t.status,
        "mode": str(t.attrs.get("mode", cfg.get("mode", "?"))),
        "strategy": str(t.attrs.get("strategy", cfg.get("strategy", "?"))),
        "ranks": ranks,
        "nodes": int(len(np.unique(node_id))) if node_id is not None and len(node_id) else 1,
        "mesh": str(t.attrs.get("mesh", cfg.get("mesh", ""))),
        "seq": seq,
        "tokens_per_rank": seq // ranks if ranks else 0,
        "heads": int(cfg.get("heads", 0)),
        "kv_heads": int(cfg.get("kv_heads", 0)),
        "head_dim": int(cfg.get("head_dim", 0)),
        "layers": int(cfg.get("layers", 0)),
        "dim": int(cfg.get("dim", 0)),
        "measured_steps": int(len(steps)),
        "time_s": _median(time_s),
        "tokens": _median(steps["tokens"]),
        "model_flops": _median(steps["model_flops"]),
        "tflops_per_rank": tflops,
        "peak_tflops_per_rank": peak,
        "mfu": mfu,
        "exposed_comm_s": _median(steps["exposed_comm_s"]),
        "exposed_comm_frac": _median(frac),
        "peak_bytes": int(np.max(steps["peak_bytes"])) if len(steps) else 0,
    }


def run_table(traces: Sequence[ctxpar_trace.Trace], peak_tflops_per_rank: Optional[float] = None) -> List[Row]:
    """A row per trace (traces with no step rows are left out: nothing was measured)."""
    rows = [run_row(t, peak_tflops_per_rank) for t in traces if len(t.steps) > 0]
    rows.sort(key=lambda r: (r["mode"], r["strategy"], r["ranks"], r["seq"], r["run"]))
    return rows


# ---------------------------------------------------------------------------------------------
# The spans of one step


TIMELINE_COLUMNS = ("rank", "step", "layer", "ring_step", "phase", "group", "begin_us", "end_us",
                    "duration_us", "flops", "bytes")


def default_timeline_step(t: ctxpar_trace.Trace) -> int:
    """The first measured step that has spans (warmup steps include one-off work such as the comm
    bench); the first step with spans when every step is warmup."""
    with_spans = sorted(set(int(s) for s in t.spans["step"]))
    if not with_spans:
        raise ctxpar_trace.TraceError(f"{t.path}: no spans")
    measured = set(int(s) for s in t.measured_steps()["step"])
    for s in with_spans:
        if s in measured:
            return s
    return with_spans[0]


def timeline_table(t: ctxpar_trace.Trace, step: Optional[int] = None) -> List[Row]:
    """A row per span of `step` (default: default_timeline_step), times in µs from the step's
    first span begin over all ranks (all ranks' times are on rank 0's clock in the trace)."""
    if step is None:
        step = default_timeline_step(t)
    spans = t.spans_where(step=step)
    if len(spans) == 0:
        raise ValueError(f"{t.path}: no spans in step {step} (steps with spans: "
                         f"{sorted(set(int(s) for s in t.spans['step']))})")
    t0 = float(spans["t_begin_us"].min())
    rows = []
    for s in spans:
        phase = t.phase_name(s["phase"])
        rows.append({
            "rank": int(s["rank"]), "step": int(s["step"]), "layer": int(s["layer"]),
            "ring_step": int(s["ring_step"]), "phase": phase, "group": phase_group(phase),
            "begin_us": float(s["t_begin_us"]) - t0, "end_us": float(s["t_end_us"]) - t0,
            "duration_us": float(s["t_end_us"] - s["t_begin_us"]),
            "flops": float(s["flops"]), "bytes": float(s["bytes"]),
        })
    rows.sort(key=lambda r: (r["rank"], r["begin_us"]))
    return rows


# ---------------------------------------------------------------------------------------------
# Scaling efficiency


SCALING_COLUMNS = ("kind", "mode", "strategy", "model", "seq", "tokens_per_rank", "ranks",
                   "base_ranks", "time_s", "base_time_s", "tflops_per_rank", "base_tflops_per_rank",
                   "speedup", "efficiency", "efficiency_time", "traces")


def _model_key(r: Row) -> str:
    # Runs are comparable only with the same model shape (all but the sequence and the mesh).
    return f"L{r['layers']}-d{r['dim']}-h{r['heads']}-kv{r['kv_heads']}-hd{r['head_dim']}"


def _aggregate_by_ranks(rows: List[Row]) -> Dict[int, Row]:
    """Several traces at one rank count (repeats, or 1x4 and 2x2 nodes x ranks): medians."""
    out: Dict[int, Row] = {}
    for ranks in sorted({int(r["ranks"]) for r in rows}):
        sel = [r for r in rows if r["ranks"] == ranks]
        out[ranks] = {
            "time_s": _median([r["time_s"] for r in sel]),
            "tflops_per_rank": _median([r["tflops_per_rank"] for r in sel]),
            "model_flops": _median([r["model_flops"] for r in sel]),
            "seq": int(sel[0]["seq"]), "traces": len(sel),
        }
    return out


def scaling_table(runs: Sequence[Row]) -> List[Row]:
    """Strong and weak scaling efficiency from runs at several rank counts.

    Series: runs of the same mode, strategy and model shape, and either the same global sequence
    (strong scaling) or the same tokens per rank (weak scaling); a series needs at least two rank
    counts. The base is the smallest rank count P0 of the series.
      strong: efficiency = T(P0)·P0 / (T(P)·P)   (same work; 1 = perfect speedup P/P0)
      weak:   efficiency = R(P) / R(P0), R = model FLOP/s per rank. With causal attention the
              FLOPs per rank grow with P at fixed tokens per rank (S² / P), so a time ratio would
              call that growth inefficiency; efficiency_time = T(P0) / T(P) is kept beside it.
    """
    rows: List[Row] = []
    by_series: Dict[tuple, List[Row]] = {}
    for r in runs:
        if not (r["time_s"] > 0):
            continue
        base = (r["mode"], r["strategy"], _model_key(r))
        by_series.setdefault(("strong",) + base + (int(r["seq"]),), []).append(r)
        by_series.setdefault(("weak",) + base + (int(r["tokens_per_rank"]),), []).append(r)
    for key in sorted(by_series):
        kind, mode, strategy, model, size = key
        agg = _aggregate_by_ranks(by_series[key])
        if len(agg) < 2:
            continue
        p0 = min(agg)
        b = agg[p0]
        for ranks, a in agg.items():
            speedup = b["time_s"] / a["time_s"]
            if kind == "strong":
                eff = b["time_s"] * p0 / (a["time_s"] * ranks)
            else:
                # FLOP/s per rank from the trace; fall back to tokens when a mode counts no FLOPs.
                ra = a["model_flops"] / (a["time_s"] * ranks)
                rb = b["model_flops"] / (b["time_s"] * p0)
                eff = ra / rb if rb > 0 else (a["seq"] / (a["time_s"] * ranks)) / (b["seq"] / (b["time_s"] * p0))
            rows.append({
                "kind": kind, "mode": mode, "strategy": strategy, "model": model,
                "seq": a["seq"], "tokens_per_rank": a["seq"] // ranks, "ranks": ranks, "base_ranks": p0,
                "time_s": a["time_s"], "base_time_s": b["time_s"],
                "tflops_per_rank": a["tflops_per_rank"], "base_tflops_per_rank": b["tflops_per_rank"],
                "speedup": speedup, "efficiency": eff, "efficiency_time": speedup,
                "traces": a["traces"],
            })
    return rows


# ---------------------------------------------------------------------------------------------
# CSV


def _csv_value(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    s = str(v)
    if any(c in s for c in ',"\n'):
        s = '"' + s.replace('"', '""') + '"'
    return s


def write_csv(path: str, rows: Sequence[Row], columns: Sequence[str]) -> str:
    """Writes `rows` (dicts) with a header of `columns`, in that order. Returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(",".join(columns) + "\n")
        for r in rows:
            f.write(",".join(_csv_value(r[c]) for c in columns) + "\n")
    return path
