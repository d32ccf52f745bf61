"""The one loader of ctxpar HDF5 traces (layout: docs/DESIGN.md section 5, schema_version 1).

    from analysis import ctxpar_trace
    t = ctxpar_trace.load("out/train.h5")      # NAME.h5, or NAME.h5.partial of an unfinished run
    t.attrs["git_sha"], t.config["seq"], t.topology["coords"]
    t.steps["time_s"], t.spans["t_begin_us"], t.span_phases(), t.summary["time_s_median"]

Everything else in analysis/ reads traces through this module, so a schema change is handled
in one place. Only h5py and numpy are used (Debian python3-h5py, python3-numpy).

Times: span t_begin_us / t_end_us are microseconds since rank 0's tracer start on rank 0's
clock (every rank's times were shifted by its measured clock offset, /topology/clock_offset_us).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

try:  # pragma: no cover - exercised only where h5py is missing
    import h5py
except ImportError as e:  # give the one fix that works on this project's machines
    raise ImportError(
        "analysis needs h5py and numpy: run with /usr/bin/python3 (Debian python3-h5py)"
    ) from e

SUPPORTED_SCHEMA_VERSIONS = (1,)
STATUSES = ("running", "complete", "truncated", "failed")

SPAN_FIELDS = ("step", "layer", "phase", "ring_step", "rank", "t_begin_us", "t_end_us", "flops", "bytes")
STEP_FIELDS = ("step", "time_s", "tokens", "model_flops", "mfu", "tflops_per_rank", "exposed_comm_s",
               "peak_bytes", "peak_rss_bytes", "loss", "turn", "ttft_s", "ttit_s")
RANK_STEP_FIELDS = ("step", "rank", "time_s", "exposed_comm_s", "peak_bytes", "peak_rss_bytes")


class TraceError(Exception):
    """The file is not a readable ctxpar trace (missing object, wrong layout)."""


class SchemaError(TraceError):
    """The file's schema_version is not one this loader knows."""


def _py(value: Any) -> Any:
    """HDF5 attribute value -> plain Python (str, int, float, bool, list of str)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in ("O", "S", "U"):
            return [_py(v) for v in value.tolist()]
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _attrs(obj) -> Dict[str, Any]:
    return {k: _py(v) for k, v in obj.attrs.items()}


def _dataset(ds) -> np.ndarray:
    data = ds[()]
    if isinstance(data, np.ndarray) and data.dtype.kind in ("O", "S"):
        return np.array([_py(v) for v in data.tolist()], dtype=object)
    return data


@dataclass
class Trace:
    path: str                      # the file actually read (may end in .partial)
    partial: bool                  # True when read from NAME.h5.partial (run not finished)
    attrs: Dict[str, Any]          # root attributes (provenance, status, steps_completed, ...)
    config: Dict[str, Any]         # every config field, typed
    topology: Dict[str, np.ndarray]  # coords[rank,4], node_id, axis_names, axis_sizes, hosts, clock_offset_us, ...
    spans: np.ndarray              # structured array, fields SPAN_FIELDS
    steps: np.ndarray              # structured array, fields STEP_FIELDS, a row per step
    rank_steps: np.ndarray         # structured array, fields RANK_STEP_FIELDS, a row per (step, rank)
    summary: Dict[str, Any]        # /summary attributes ({} for an unfinished run)
    phase_names: List[str] = field(default_factory=list)
    generated: Optional[np.ndarray] = None  # inference: token ids [turn, step, batch], else None

    @property
    def schema_version(self) -> int:
        return int(self.attrs["schema_version"])

    @property
    def status(self) -> str:
        return str(self.attrs["status"])

    @property
    def steps_completed(self) -> int:
        return int(self.attrs["steps_completed"])

    @property
    def world_size(self) -> int:
        return int(self.attrs.get("world_size", len(self.topology.get("coords", []))))

    def phase_name(self, code: int) -> str:
        code = int(code)
        return self.phase_names[code] if 0 <= code < len(self.phase_names) else f"phase{code}"

    def phase_code(self, name: str) -> int:
        try:
            return self.phase_names.index(name)
        except ValueError:
            raise KeyError(f"unknown phase {name!r}; known: {', '.join(self.phase_names)}") from None

    def span_phases(self) -> np.ndarray:
        """Phase name of every span (array of str, same order as .spans)."""
        names = np.array(self.phase_names + ["?"], dtype=object)
        codes = self.spans["phase"].astype(np.int64)
        codes = np.where((codes >= 0) & (codes < len(self.phase_names)), codes, len(self.phase_names))
        return names[codes]

    def span_durations_us(self) -> np.ndarray:
        return self.spans["t_end_us"] - self.spans["t_begin_us"]

    def spans_where(self, phase: Optional[str] = None, rank: Optional[int] = None,
                    step: Optional[int] = None, layer: Optional[int] = None) -> np.ndarray:
        """Spans filtered by phase name, rank, step and/or layer."""
        keep = np.ones(len(self.spans), dtype=bool)
        if phase is not None:
            keep &= self.spans["phase"] == self.phase_code(phase)
        if rank is not None:
            keep &= self.spans["rank"] == rank
        if step is not None:
            keep &= self.spans["step"] == step
        if layer is not None:
            keep &= self.spans["layer"] == layer
        return self.spans[keep]

    def warmup_steps(self) -> int:
        """Rows of /steps that are warmup (the first config['warmup'] rows)."""
        if "warmup_steps_excluded" in self.summary:
            return int(self.summary["warmup_steps_excluded"])
        return min(int(self.config.get("warmup", 0)), len(self.steps))

    def measured_steps(self) -> np.ndarray:
        """Rows of /steps after the warmup rows (what /summary's medians are over)."""
        return self.steps[self.warmup_steps():]


def resolve_path(path: str) -> str:
    """NAME.h5 if it exists, else NAME.h5.partial if that exists; FileNotFoundError otherwise."""
    if os.path.isfile(path):
        return path
    if not path.endswith(".partial") and os.path.isfile(path + ".partial"):
        return path + ".partial"
    raise FileNotFoundError(f"no trace at {path!r} (nor {path + '.partial'!r})")


def _open(path: str):
    # A running job's writer holds the file; skip HDF5's file lock so a live .partial can be read.
    try:
        return h5py.File(path, "r", locking=False)
    except TypeError:  # h5py < 3.5 has no `locking`
        return h5py.File(path, "r")


def _table(f, name: str, fields) -> np.ndarray:
    if name not in f:
        raise TraceError(f"{f.filename}: missing /{name.lstrip('/')}")
    data = f[name][()]
    missing = [x for x in fields if x not in (data.dtype.names or ())]
    if missing:
        raise TraceError(f"{f.filename}: /{name.lstrip('/')} lacks fields {missing}")
    return data


def load(path: str) -> Trace:
    """Reads a ctxpar trace. Accepts NAME.h5 or NAME.h5.partial (or NAME.h5 when only the
    .partial exists). Raises SchemaError for an unknown schema_version, TraceError for a file
    that is not a ctxpar trace, FileNotFoundError when there is no file."""
    real = resolve_path(path)
    try:
        f = _open(real)
    except OSError as e:
        raise TraceError(f"{real}: cannot open as HDF5 ({e})") from e
    with f:
        attrs = _attrs(f)
        if "schema_version" not in attrs:
            raise TraceError(f"{real}: no schema_version attribute; not a ctxpar trace")
        version = attrs["schema_version"]
        if not isinstance(version, int) or version not in SUPPORTED_SCHEMA_VERSIONS:
            raise SchemaError(
                f"{real}: trace schema_version {version!r} is not supported by this loader "
                f"(supported: {', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}); "
                "use the analysis/ of the ctxpar version that wrote it")
        for key in ("status", "steps_completed"):
            if key not in attrs:
                raise TraceError(f"{real}: missing root attribute {key!r}")
        if attrs["status"] not in STATUSES:
            raise TraceError(f"{real}: unknown status {attrs['status']!r}")
        config = _attrs(f["config"]) if "config" in f else {}
        topology: Dict[str, np.ndarray] = {}
        if "topology" in f:
            for k, ds in f["topology"].items():
                topology[k] = _dataset(ds)
        spans = _table(f, "spans", SPAN_FIELDS)
        phase_names = _py(f["spans"].attrs.get("phase_names", np.array([], dtype=object)))
        steps = _table(f, "steps", STEP_FIELDS)
        rank_steps = _table(f, "rank_steps", RANK_STEP_FIELDS)
        summary = _attrs(f["summary"]) if "summary" in f else {}
        generated = f["generated"][()] if "generated" in f else None
    return Trace(path=real, partial=real.endswith(".partial"), attrs=attrs, config=config,
                 topology=topology, spans=spans, steps=steps, rank_steps=rank_steps,
                 summary=summary, phase_names=list(phase_names), generated=generated)
