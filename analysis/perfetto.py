"""Exports a ctxpar trace as Chrome trace-event JSON, for https://ui.perfetto.dev or chrome://tracing.

    /usr/bin/python3 -m analysis.perfetto out/train.h5 -o out/train.json [--step N]

Mapping: one process per rank (pid = rank, named "rank r (host)"), one thread per phase group
(tid: 0 compute, 1 comm, 2 wait, 3 other — analysis/tables.py PHASE_GROUPS), one complete event
("ph": "X") per span with ts and dur in µs on rank 0's clock (the trace's own times), the phase
as name and step, layer, ring_step, flops and bytes as args. Metadata events ("ph": "M") name the
processes and threads. The HDF5 trace stays the record; this is a view of it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, Optional

if __package__ in (None, ""):  # run as a script: make `analysis` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis import ctxpar_trace, tables  # noqa: E402

GROUP_TID = {g: i for i, g in enumerate(tables.GROUP_ORDER)}


def chrome_trace(t: ctxpar_trace.Trace, step: Optional[int] = None) -> Dict:
    """The trace (or one step of it) as a Chrome trace-event object."""
    spans = t.spans if step is None else t.spans_where(step=step)
    hosts = t.topology.get("hosts")
    events = []
    for rank in range(t.world_size):
        host = f" ({hosts[rank]})" if hosts is not None and rank < len(hosts) else ""
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}{host}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        for group, tid in GROUP_TID.items():
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": group}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"sort_index": tid}})
    for s in spans:
        phase = t.phase_name(s["phase"])
        group = tables.phase_group(phase)
        events.append({
            "name": phase, "cat": group, "ph": "X",
            "pid": int(s["rank"]), "tid": GROUP_TID[group],
            "ts": float(s["t_begin_us"]), "dur": float(s["t_end_us"] - s["t_begin_us"]),
            "args": {"step": int(s["step"]), "layer": int(s["layer"]), "ring_step": int(s["ring_step"]),
                     "flops": float(s["flops"]), "bytes": float(s["bytes"])},
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": t.path, "mode": str(t.attrs.get("mode", "")), "strategy": str(t.attrs.get("strategy", "")),
            "mesh": str(t.attrs.get("mesh", "")), "status": t.status, "git_sha": str(t.attrs.get("git_sha", "")),
            "time": "µs on rank 0's clock (clock offsets applied by ctxpar)",
        },
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="NAME.h5 (or NAME.h5.partial)")
    p.add_argument("-o", "--out", help="output JSON (default: the trace's name with .json)")
    p.add_argument("--step", type=int, help="export only this step")
    args = p.parse_args(argv)
    try:
        t = ctxpar_trace.load(args.trace)
    except (ctxpar_trace.TraceError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or t.path.split(".h5")[0] + ".json"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    obj = chrome_trace(t, args.step)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))
    n = sum(1 for e in obj["traceEvents"] if e["ph"] == "X")
    print(f"{out}: {n} spans of {t.world_size} ranks (open in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
