#!/usr/bin/python3
"""Checks run directories written by jobs/ctxpar.sbatch (directly or through jobs/sweep.py).

    check_runs.py --ranks 4 --steps 3 --launcher srun --slurm RUN_DIR        # one run
    check_runs.py --ranks 2 --steps 3 --sweep 2 SWEEP_DIR                    # every run of a sweep
    check_runs.py --min-flushed 3 RUN_DIR        # exit 0 once the (running) trace has 3 steps

Per run: args, exit_code (0, or --exit-code: 138 = 128 + SIGUSR1 for a run stopped by USR1), config.txt (the parsed configuration, mesh product = ranks), the
launch command, and the trace read with analysis/ctxpar_trace.py: status, world size, one step
row per completed step, numbered 0.., spans of every rank in every step, positive step times.
Exit 0 when everything holds; otherwise every failure is printed and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from analysis import ctxpar_trace  # noqa: E402

failures = []


def check(cond: bool, where: str, msg: str) -> bool:
    if not cond:
        failures.append(f"{where}: {msg}")
    return cond


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def check_run(d: str, args) -> None:
    w = os.path.basename(d.rstrip("/"))
    check(read(os.path.join(d, "args")).strip() != "", w, "no args file")
    code = read(os.path.join(d, "exit_code")).strip()
    if not check(code == str(args.exit_code), w, f"exit_code {code!r} (job.out tail: {read(os.path.join(d, 'job.out'))[-800:]!r})"):
        return
    config = read(os.path.join(d, "config.txt"))
    m = re.search(r"^\s*mesh\s*=\s*(\S+)", config, re.M)
    if check(m is not None, w, "config.txt has no mesh line"):
        sizes = [int(x.split(":")[1]) for x in m.group(1).split(",")]
        check(int(np.prod(sizes)) == args.ranks, w, f"config.txt mesh {m.group(1)} is not {args.ranks} ranks")
    check(re.search(r"^\s*strategy\s*=", config, re.M) is not None, w, "config.txt has no strategy line")
    if args.launcher:
        cmd = read(os.path.join(d, "command")).split()
        check(bool(cmd) and cmd[0] == args.launcher, w, f"launched with {cmd[:1]}, expected {args.launcher}")
    if args.slurm:
        check(re.search(r"^# ctxpar job \d+", read(os.path.join(d, "job.out")), re.M) is not None, w,
              "job.out does not show a SLURM job id (did it run under SLURM?)")
    path = os.path.join(d, "trace.h5")
    if not check(os.path.isfile(path), w, "no trace.h5 (the run did not close its trace)"):
        return
    t = ctxpar_trace.load(path)
    check(not t.partial, w, "trace read from .partial")
    check(t.status == args.status, w, f"status {t.status!r}, expected {args.status!r}")
    check(t.world_size == args.ranks, w, f"world_size {t.world_size}, expected {args.ranks}")
    n = t.steps_completed
    if args.status == "complete" and args.steps is not None:
        check(n == args.steps, w, f"steps_completed {n}, expected {args.steps}")
    if args.status == "truncated":
        # Stopped early by USR1: some steps done, far fewer than asked for.
        check(n >= 3 and n < int(t.config.get("steps", 0)), w,
              f"truncated run has {n} steps (asked {t.config.get('steps')})")
    check(len(t.steps) == n, w, f"{len(t.steps)} step rows, steps_completed {n}")
    check(np.array_equal(t.steps["step"], np.arange(len(t.steps))), w, f"step column {t.steps['step']}")
    check(bool(np.all(t.steps["time_s"] > 0)), w, "a step time is not positive")
    have = set(zip(t.spans["step"].tolist(), t.spans["rank"].tolist()))
    missing = [(s, r) for s in range(n) for r in range(args.ranks) if (s, r) not in have]
    check(not missing, w, f"no spans for (step, rank) {missing[:6]}")
    if args.status == "complete":
        check(bool(t.summary), w, "no /summary")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+")
    p.add_argument("--ranks", type=int)
    p.add_argument("--steps", type=int, help="expected steps_completed (warmup + steps)")
    p.add_argument("--status", default="complete")
    p.add_argument("--exit-code", type=int, default=0, help="expected exit code (128 + N: stopped by signal N)")
    p.add_argument("--launcher", choices=("srun", "mpirun"))
    p.add_argument("--slurm", action="store_true", help="the run must have run inside a SLURM job")
    p.add_argument("--sweep", type=int, help="dirs are sweep directories with this many runs each")
    p.add_argument("--min-flushed", type=int, help="only: has the trace flushed this many steps?")
    args = p.parse_args()
    if args.min_flushed is not None:
        try:
            t = ctxpar_trace.load(os.path.join(args.dirs[0], "trace.h5"))
        except (FileNotFoundError, ctxpar_trace.TraceError, OSError):
            return 1
        return 0 if t.steps_completed >= args.min_flushed else 1
    runs = []
    for d in args.dirs:
        if args.sweep is None:
            runs.append(d)
            continue
        manifest = json.loads(read(os.path.join(d, "sweep.json")) or "{}")
        listed = [r["dir"] for r in manifest.get("runs", [])]
        check(len(listed) == args.sweep, d, f"sweep.json lists {len(listed)} runs, expected {args.sweep}")
        if args.slurm:
            check(all("job_id" in r for r in manifest.get("runs", [])), d, "a run has no job_id in sweep.json")
        runs += [x if os.path.isabs(x) else os.path.join(os.getcwd(), x) for x in listed]
    for d in runs:
        check_run(d, args)
    for f in failures:
        print("FAIL", f)
    if not failures:
        print(f"ok: {len(runs)} run(s): {', '.join(os.path.basename(r.rstrip('/')) for r in runs)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
