#!/usr/bin/python3
"""Sweeps of ctxpar runs: node counts x strategies x sequence lengths, one run directory each.

    jobs/sweep.py --nodes 1,2 --ranks-per-node 4 --strategies ring,allgather --seq 4K,8K \\
                  --mode run --out runs/sweep1 --submit [--array] [--wait]   # SLURM
    jobs/sweep.py ... --local                                            # mpirun here, one by one
    jobs/sweep.py ... --print                                            # show the commands only
    jobs/sweep.py ... -- heads=32 kv_heads=8 steps=10                    # more ctxpar settings

Every run goes through jobs/ctxpar.sbatch (also for --local, where it launches with mpirun), so a
local sweep and a cluster sweep leave the same run directories:
    OUT/sweep.json         the sweep: its parameters and every run (name, nodes, ranks, args, job id)
    OUT/runs.txt           the run directories, one a line (job arrays index it)
    OUT/<run>/args         ctxpar's arguments, one a line    OUT/<run>/config.txt  config as parsed
    OUT/<run>/trace.h5     the trace                         OUT/<run>/job.out     the job's output
    OUT/<run>/exit_code    written when the job ends
The figures read a sweep directory directly: /usr/bin/python3 -m analysis.figures OUT.

Mesh per strategy (P = nodes x ranks-per-node): allgather, ring -> ring:P; ulysses -> ulysses:P;
usp -> ulysses:<ranks-per-node>,ring:<nodes> (all-to-all inside a node, ring across nodes).
--mesh overrides it with a template, e.g. --mesh 'ulysses:{rpn},ring:{nodes}' ({P} also works).
On one machine (--local) --nodes multiplies the ranks: --nodes 2 --ranks-per-node 2 runs 4 ranks,
usp on ulysses:2,ring:2 (with --nodes 1 usp's ring axis is 1 and it runs as ulysses; the sweep says so).
--local skips runs that already finished (exit_code 0 and trace.h5 present) unless --force.
A --local sweep of train or bench train gives every run one MFU peak (peak_tflops_per_rank=): one
core's FMA-loop rate (ctxpar bench peak threads=1) measured once, times OMP_NUM_THREADS, recorded in
sweep.json and reused when the sweep runs again, so MFU compares across its runs; give
peak_tflops_per_rank=X after -- to set it yourself. (On a cluster each run measures its own.)

At the end of a --local sweep (and of --submit --wait) one table compares the runs, a row each:
loss, step time, tokens/s, exposed communication, TFLOP/s, MFU and its peak, memory, status; train
runs that differ only in strategy and mesh have their losses compared step by step, against the
tolerance the tests hold them to. The same table later: /usr/bin/python3 -m analysis.summary OUT
[--csv]. Compare the four training strategies on 4 local ranks:
    jobs/sweep.py --local --quiet --mode train --config inputs/default.toml --seq 1K \\
                  --nodes 2 --ranks-per-node 2 --strategies allgather,ulysses,ring,usp
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBATCH_SCRIPT = {"srun": os.path.join(REPO, "jobs", "ctxpar.sbatch"),
                 "mpirun": os.path.join(REPO, "jobs", "ctxpar-mpirun.sbatch")}
SWEEP_KEYS = ("strategy", "seq", "mesh", "out")  # set by the sweep for every run

DEFAULT_MESH = {"allgather": "ring:{P}", "ring": "ring:{P}", "ring_pass_q": "ring:{P}",
                "ulysses": "ulysses:{P}", "usp": "ulysses:{rpn},ring:{nodes}"}


def parse_int_list(text: str, what: str) -> List[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"sweep.py: {what} must be comma-separated integers, got {text!r}")
    if not vals or any(v < 1 for v in vals):
        raise SystemExit(f"sweep.py: {what} must be positive integers, got {text!r}")
    return vals


def parse_tokens(text: str) -> int:
    """'4K' -> 4096, '1M' -> 1048576, '3000' -> 3000 (ctxpar's own suffixes)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KkMmGg]?)\s*", text)
    if not m:
        raise SystemExit(f"sweep.py: bad sequence length {text!r} (e.g. 4K, 128K, 1M, 3000)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def fmt_tokens(n: int) -> str:
    for shift, suffix in ((20, "M"), (10, "K")):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def plan(args) -> List[Dict]:
    """The runs of the sweep, in submission order."""
    runs = []
    for nodes in args.nodes:
        for strategy in args.strategies:
            for seq in args.seq:
                P = nodes * args.ranks_per_node
                template = args.mesh or DEFAULT_MESH.get(strategy, "ring:{P}")
                mesh = template.format(P=P, nodes=nodes, rpn=args.ranks_per_node)
                name = f"{args.mode.replace(' ', '-')}-{strategy}-n{nodes}x{args.ranks_per_node}-s{fmt_tokens(seq)}"
                ctx_args = args.mode.split() + (["--config", args.config] if args.config else [])
                ctx_args += [f"strategy={strategy}", f"seq={seq}", f"mesh={mesh}"] + list(args.overrides)
                runs.append({"name": name, "dir": os.path.join(os.path.abspath(args.out), name), "nodes": nodes,
                             "ranks_per_node": args.ranks_per_node, "ranks": P, "strategy": strategy,
                             "seq": seq, "mesh": mesh, "args": ctx_args})
    for r in runs:
        if r["strategy"] == "usp" and not args.mesh and (r["nodes"] == 1 or args.ranks_per_node == 1) and r["ranks"] > 1:
            print(f"sweep.py: note: {r['name']} runs usp on mesh {r['mesh']}: one axis is 1, so it is "
                  f"{'ring' if args.ranks_per_node == 1 else 'ulysses'} alone (a 2-D mesh: --nodes N "
                  "--ranks-per-node M with both > 1, or --mesh)", file=sys.stderr)
    names = [r["name"] for r in runs]
    if len(set(names)) != len(names):
        raise SystemExit("sweep.py: two runs would share a directory (repeated values in a list?)")
    return runs


PEAK_MODES = ("train", "bench train")  # the modes whose MFU divides by a measured CPU peak


def sweep_peak(args) -> str:
    """The peak_tflops_per_rank= of every run of a --local train sweep ("" where the user set one,
    or the runs measure their own): the one this sweep recorded before, else measured now."""
    if not args.local or args.mode not in PEAK_MODES:
        return ""
    if any(o.lstrip("-").startswith("peak_tflops_per_rank=") for o in args.overrides):
        return ""
    try:
        with open(os.path.join(args.out, "sweep.json")) as f:
            for o in json.load(f).get("overrides", []):
                if o.startswith("peak_tflops_per_rank="):
                    return o.split("=", 1)[1]
    except (OSError, ValueError):
        pass
    tmp = tempfile.mkdtemp(prefix="ctxpar-peak-")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        p = subprocess.run([args.ctxpar, "bench", "peak", "csv=true", "threads=1", "out=" + os.path.join(tmp, "peak.h5")],
                           env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [l.split(",") for l in p.stdout.splitlines() if l and not l.startswith("#")]
    if p.returncode != 0 or len(rows) < 2 or "fma_gflops" not in rows[0]:
        raise SystemExit(f"sweep.py: ctxpar bench peak failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    core_gflops = float(rows[1][rows[0].index("fma_gflops")])
    threads = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    return f"{core_gflops * threads / 1000:.6g}"


def sbatch_command(args, nodes: int, export: Dict[str, str], output: str, array: str = "") -> List[str]:
    cmd = ["sbatch", "--parsable", "-J", args.job_name, "-N", str(nodes),
           "--ntasks-per-node", str(args.ranks_per_node), "-o", output]
    if array:
        cmd += ["--array", array]
    if args.cpus_per_task:
        cmd += ["--cpus-per-task", str(args.cpus_per_task)]
    if args.time:
        cmd += ["--time", args.time]
    if args.partition:
        cmd += ["-p", args.partition]
    if args.account:
        cmd += ["-A", args.account]
    for extra in args.sbatch_arg:
        cmd += shlex.split(extra)
    for k, v in export.items():
        if "," in v:
            raise SystemExit(f"sweep.py: {k}={v!r}: sbatch --export cannot carry a comma in a value")
    cmd.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in export.items()))
    cmd.append(SBATCH_SCRIPT[args.launcher])
    return cmd


def base_export(args) -> Dict[str, str]:
    return {"CTXPAR_REPO": REPO, "CTXPAR_BIN": os.path.abspath(args.ctxpar), "CTXPAR_LAUNCH": args.launcher}


def write_run_dirs(args, runs: List[Dict]) -> None:
    os.makedirs(args.out, exist_ok=True)
    for r in runs:
        os.makedirs(r["dir"], exist_ok=True)
        with open(os.path.join(r["dir"], "args"), "w") as f:
            f.write("\n".join(r["args"]) + "\n")
    with open(os.path.join(args.out, "runs.txt"), "w") as f:
        f.write("".join(os.path.abspath(r["dir"]) + "\n" for r in runs))
    save_manifest(args, runs)


def save_manifest(args, runs: List[Dict]) -> None:
    manifest = {"created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": " ".join(shlex.quote(a) for a in sys.argv),
                "mode": args.mode, "nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
                "strategies": args.strategies, "seq": args.seq, "overrides": list(args.overrides),
                "ctxpar": os.path.abspath(args.ctxpar), "runs": runs}
    tmp = os.path.join(args.out, "sweep.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(args.out, "sweep.json"))


def clean_run_dir(d: str) -> None:
    # Outputs of an earlier attempt; `args` stays (it is the run's definition).
    for name in ("trace.h5", "trace.h5.partial", "config.txt", "job.out", "exit_code", "command", "slurm.out"):
        p = os.path.join(d, name)
        if os.path.exists(p):
            os.remove(p)


def finished(d: str) -> bool:
    try:
        with open(os.path.join(d, "exit_code")) as f:
            return f.read().strip() == "0" and os.path.exists(os.path.join(d, "trace.h5"))
    except OSError:
        return False


def run_status(rc: int, d: str) -> str:
    """ctxpar's exit codes: 0 complete, 2 bad input, 3 a fault (trace marked failed), 128 + N stopped
    by signal N (trace truncated, every completed step kept)."""
    if rc == 0:
        return "ok"
    if 128 < rc < 160:
        return f"TRUNCATED by signal {rc - 128} (exit {rc}; the trace keeps the completed steps)"
    what = {2: "bad input", 3: "failed"}.get(rc, "FAILED")
    return f"{what} (exit {rc}; see {d}/job.out)"


def run_local(args, runs: List[Dict]) -> int:
    failed = 0
    for i, r in enumerate(runs):
        tag = f"[{i + 1}/{len(runs)}] {r['name']} ({r['ranks']} ranks)"
        if finished(r["dir"]) and not args.force:
            print(f"{tag}: done before, kept (--force reruns)")
            continue
        clean_run_dir(r["dir"])
        env = dict(os.environ)
        env.update(base_export(args))
        env.update(CTXPAR_LAUNCH="mpirun", CTXPAR_RUN_DIR=r["dir"], CTXPAR_NP=str(r["ranks"]))
        env.setdefault("OMP_NUM_THREADS", "1")
        for k in ("SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID"):  # inside an allocation: still a local run
            env.pop(k, None)
        t0 = time.time()
        proc = subprocess.run(["bash", SBATCH_SCRIPT["srun"]], env=env,
                              stdout=subprocess.DEVNULL if args.quiet else None, stderr=subprocess.STDOUT)
        status = run_status(proc.returncode, r["dir"])
        failed += proc.returncode != 0
        print(f"{tag}: {status}, {time.time() - t0:.1f} s", flush=True)
    print(f"sweep {args.out}: {len(runs) - failed} of {len(runs)} runs succeeded")
    print_table(args.out)
    return 1 if failed else 0


def print_table(out: str) -> None:
    """The per-run table of analysis.summary (the same code as `python3 -m analysis.summary OUT`)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    try:
        from analysis import summary
    except ImportError as e:  # h5py/numpy missing in this Python: the runs are there, the table is not
        print(f"sweep.py: no table of the runs ({e})")
        return
    print(flush=True)
    try:
        print(summary.directory_report(out)[0], flush=True)
    except Exception as e:  # the table is a report: it never changes the sweep's outcome
        print(f"sweep.py: no table of the runs ({type(e).__name__}: {e})")


def submit(args, runs: List[Dict]) -> int:
    job_ids = []
    if args.array:
        by_nodes: Dict[int, List[Dict]] = {}
        for r in runs:
            by_nodes.setdefault(r["nodes"], []).append(r)
        for nodes, group in by_nodes.items():
            lst = os.path.abspath(os.path.join(args.out, f"array-n{nodes}.txt"))
            with open(lst, "w") as f:
                f.write("".join(os.path.abspath(r["dir"]) + "\n" for r in group))
            out = os.path.abspath(os.path.join(args.out, f"array-n{nodes}-%A_%a.out"))
            cmd = sbatch_command(args, nodes, dict(base_export(args), CTXPAR_SWEEP_LIST=lst), out,
                                 array=f"0-{len(group) - 1}")
            jid = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().split(";")[0]
            job_ids.append(jid)
            for i, r in enumerate(group):
                r["job_id"] = f"{jid}_{i}"
            print(f"submitted job array {jid} ({len(group)} runs on {nodes} node(s))")
    else:
        for r in runs:
            export = dict(base_export(args), CTXPAR_RUN_DIR=os.path.abspath(r["dir"]))
            cmd = sbatch_command(args, r["nodes"], export, os.path.abspath(os.path.join(r["dir"], "slurm.out")))
            jid = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().split(";")[0]
            r["job_id"] = jid
            job_ids.append(jid)
            print(f"submitted {jid}: {r['name']}")
    save_manifest(args, runs)
    if not args.wait:
        return 0
    deadline = time.time() + args.wait_timeout
    while True:
        q = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True)
        # squeue fails for job ids it no longer knows (all finished and purged): nothing pending.
        if q.returncode != 0 or not q.stdout.strip():
            break
        if time.time() > deadline:
            print(f"sweep.py: jobs still queued or running after {args.wait_timeout} s: "
                  f"{' '.join(q.stdout.split())}", file=sys.stderr)
            return 1
        time.sleep(2)
    failed = 0
    for r in runs:
        code = "missing"
        try:
            with open(os.path.join(r["dir"], "exit_code")) as f:
                code = f.read().strip()
        except OSError:
            pass
        failed += code != "0"
        print(f"{r['name']}: job {r['job_id']}, exit code {code}")
    print(f"sweep {args.out}: {len(runs) - failed} of {len(runs)} runs succeeded")
    print_table(args.out)
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1", help="node counts, e.g. 1,2,4 (locally: a rank multiplier)")
    p.add_argument("--ranks-per-node", type=int, default=4, help="MPI ranks per node (default 4)")
    p.add_argument("--strategies", default="ring", help="e.g. ring,allgather,ulysses,usp")
    p.add_argument("--seq", default="4K", help="global sequence lengths, e.g. 4K,8K,16K")
    p.add_argument("--mode", default="run", help="ctxpar mode: run, train, 'bench cp', ... (default run)")
    p.add_argument("--config", help="TOML configuration passed to every run (--config)")
    p.add_argument("--mesh", help="mesh template, e.g. 'ulysses:{rpn},ring:{nodes}' (default per strategy)")
    p.add_argument("--out", default=None, help="sweep directory (default runs/sweep-<time>)")
    p.add_argument("--ctxpar", default=os.path.join(REPO, "build", "ctxpar"), help="the ctxpar binary")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--print", action="store_true", help="print the runs and commands; write nothing")
    what.add_argument("--local", action="store_true", help="run here with mpirun, one run after another")
    what.add_argument("--submit", action="store_true", help="submit to SLURM (one job per run)")
    p.add_argument("--array", action="store_true", help="--submit as one job array per node count")
    p.add_argument("--wait", action="store_true", help="--submit: wait for the jobs and report exit codes")
    p.add_argument("--wait-timeout", type=float, default=24 * 3600, help="seconds (default one day)")
    p.add_argument("--launcher", choices=("srun", "mpirun"), default="srun", help="inside SLURM (default srun --mpi=pmix)")
    p.add_argument("--job-name", default="ctxpar")
    p.add_argument("--time", help="sbatch --time (keep >= 3 min so USR1@120 s can flush the trace)")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--cpus-per-task", type=int, help="sbatch --cpus-per-task (OpenMP threads per rank)")
    p.add_argument("--sbatch-arg", action="append", default=[], help="more sbatch options, e.g. '--gpus-per-node=8'")
    p.add_argument("--force", action="store_true", help="--local: rerun runs that finished before")
    p.add_argument("--quiet", action="store_true", help="--local: only one line per run")
    p.add_argument("overrides", nargs="*", help="more ctxpar settings as key=value (after --)")
    args = p.parse_args(argv)

    args.nodes = parse_int_list(args.nodes, "--nodes")
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    args.seq = [parse_tokens(s) for s in args.seq.split(",") if s.strip()]
    if args.ranks_per_node < 1:
        raise SystemExit("sweep.py: --ranks-per-node must be >= 1")
    for o in args.overrides:
        key = o.lstrip("-").split("=", 1)[0]
        if "=" not in o:
            raise SystemExit(f"sweep.py: setting {o!r} is not key=value")
        if key in SWEEP_KEYS:
            raise SystemExit(f"sweep.py: {key}= is set by the sweep (use --strategies/--seq/--mesh)")
    if args.out is None:
        args.out = os.path.join("runs", time.strftime("sweep-%Y%m%d-%H%M%S"))
    if (args.array or args.wait) and not args.submit:
        raise SystemExit("sweep.py: --array and --wait go with --submit")
    if not args.print and os.access(args.ctxpar, os.X_OK):
        if peak := sweep_peak(args):
            args.overrides = list(args.overrides) + ["peak_tflops_per_rank=" + peak]
            print(f"sweep {args.out}: MFU against peak_tflops_per_rank={peak} for every run (one core's FMA loop, "
                  "measured once for this sweep)", flush=True)
    runs = plan(args)

    if args.print:
        for r in runs:  # the per-run sbatch command (--submit without --array)
            export = dict(base_export(args), CTXPAR_RUN_DIR=os.path.abspath(r["dir"]))
            sb = sbatch_command(args, r["nodes"], export, os.path.abspath(os.path.join(r["dir"], "slurm.out")))
            print(f"# {r['name']}: {r['ranks']} ranks; ctxpar {' '.join(shlex.quote(a) for a in r['args'])}")
            print(" ".join(shlex.quote(c) for c in sb))
        return 0
    if not os.access(args.ctxpar, os.X_OK):
        raise SystemExit(f"sweep.py: no executable {args.ctxpar} (build first: make build, or --ctxpar PATH)")
    if args.submit and shutil.which("sbatch") is None:
        raise SystemExit("sweep.py: no sbatch here (use --local to run with mpirun)")
    write_run_dirs(args, runs)
    return run_local(args, runs) if args.local else submit(args, runs)


if __name__ == "__main__":
    sys.exit(main())
