"""Trace tests driven from Python: a traced run with known content (tests/mpi/trace_fixture.cpp)
is made under mpirun, then read with analysis/ctxpar_trace.py.

  --case loader    complete run: schema, attrs, config, topology, spans, steps, summary, the
                   summary CLI, rejection of an unknown schema_version
  --case crash     every rank exits right after a flushed step: NAME.h5.partial stays, status
                   "running", every flushed step readable
  --case signal    SIGTERM sent from outside to one rank's process: all ranks stop after the same
                   step, status "truncated", file renamed
  --case watchdog  one rank stalls with watchdog_s=1: the job is aborted within seconds and the
                   message names the step, layer and phase

Run by ctest (tests/python/CMakeLists.txt) with /usr/bin/python3.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

LAYERS = 2  # trace_fixture.cpp: kLayers


def spans_per_rank_step(P: int) -> int:
    return LAYERS * (P + 1)  # P attn_fwd spans and one comm_wait span per layer


class Ctx:
    def __init__(self, args):
        self.fixture = args.fixture
        self.mpirun = args.mpirun
        self.source = args.source
        self.work = os.path.join(args.workdir, args.case)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        sys.path.insert(0, self.source)
        from analysis import ctxpar_trace  # noqa: E402
        self.ct = ctxpar_trace
        env = dict(os.environ)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        env["OMP_NUM_THREADS"] = "1"
        self.env = env

    def command(self, np_: int):
        return [self.mpirun, "-np", str(np_), "--oversubscribe", "--bind-to", "none", self.fixture]

    def run_fixture(self, np_: int, timeout: float, **settings) -> subprocess.CompletedProcess:
        env = dict(self.env)
        for k, v in settings.items():
            env["CTXPAR_FIXTURE_" + k.upper()] = str(v)
        return subprocess.run(self.command(np_), env=env, capture_output=True, text=True, timeout=timeout)


def check(cond: bool, msg: str):
    if not cond:
        raise AssertionError(msg)


def check_steps_and_spans(t, P: int, n_steps: int):
    """The fixture's known content for n_steps steps on P ranks."""
    check(len(t.steps) == n_steps, f"{len(t.steps)} step rows, expected {n_steps}")
    check(np.array_equal(t.steps["step"], np.arange(n_steps)), f"step column {t.steps['step']}")
    check(np.all(t.steps["tokens"] == 1024), "tokens column")
    check(np.all(t.steps["model_flops"] == 4e9), "model_flops column")
    check(np.allclose(t.steps["loss"], 1.0 / (np.arange(n_steps) + 1), rtol=0, atol=0), "loss column")
    check(np.all(t.steps["time_s"] > 0), "time_s must be positive")
    check(np.allclose(t.steps["mfu"], 4e9 / (t.steps["time_s"] * 1e12 * P), rtol=1e-12, atol=0),
          "mfu != model_flops / (time_s * peak * P)")
    check(np.allclose(t.steps["tflops_per_rank"], 4e9 / t.steps["time_s"] / P / 1e12, rtol=1e-12, atol=0),
          "tflops_per_rank")
    check(len(t.rank_steps) == n_steps * P, f"{len(t.rank_steps)} rank_steps rows, expected {n_steps * P}")
    # Step time is the max over ranks of each rank's time.
    rs = t.rank_steps
    for s in range(n_steps):
        check(t.steps["time_s"][s] == rs["time_s"][rs["step"] == s].max(), f"step {s}: time_s is not the max over ranks")

    per = spans_per_rank_step(P)
    check(len(t.spans) == n_steps * P * per, f"{len(t.spans)} spans, expected {n_steps * P * per}")
    for s in range(n_steps):
        for r in range(P):
            n = int(np.count_nonzero((t.spans["step"] == s) & (t.spans["rank"] == r)))
            check(n == per, f"step {s} rank {r}: {n} spans, expected {per}")
    phases = t.span_phases()
    check(set(phases.tolist()) == {"attn_fwd", "comm_wait"}, f"phases {set(phases.tolist())}")
    attn = t.spans_where(phase="attn_fwd")
    check(len(attn) == n_steps * P * LAYERS * P, "attn_fwd span count")
    check(np.array_equal(attn["flops"], 1e6 * (attn["rank"] + 1)), "attn_fwd flops do not match the rank")
    check(set(attn["ring_step"].tolist()) == set(range(P)), "ring steps")
    check(set(t.spans["layer"].tolist()) == set(range(LAYERS)), "layers")
    check(np.all(t.span_durations_us() >= 0), "a span ends before it begins")
    check(np.all(t.spans_where(phase="comm_wait")["ring_step"] == -1), "comm_wait ring_step")


def case_loader(c: Ctx):
    P, n_steps, warmup = 2, 5, 2
    out = os.path.join(c.work, "sub", "run.h5")  # sub/ does not exist: the writer creates it
    r = c.run_fixture(P, 120, out=out, steps=n_steps, warmup=warmup)
    check(r.returncode == 0, f"fixture failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr}")
    check(os.path.isfile(out), "NAME.h5 missing after a clean run")
    check(not os.path.exists(out + ".partial"), ".partial left after a clean run")

    t = c.ct.load(out)
    check(t.schema_version == 1 and not t.partial, "schema_version / partial")
    check(t.status == "complete", f"status {t.status}")
    check(t.steps_completed == n_steps, f"steps_completed {t.steps_completed}")
    a = t.attrs
    for key in ("ctxpar_version", "git_sha", "build_type", "cxx_compiler", "mpi_version", "hdf5_version",
                "blas", "mode", "strategy", "flop_convention", "start_time_utc", "end_time_utc", "mfu_note"):
        check(isinstance(a.get(key), str), f"root attribute {key} missing or not a string: {a.get(key)!r}")
    check(a["git_sha"] != "" and a["git_dirty"] in (-1, 0, 1), "git provenance")
    check(a["mode"] == "fixture" and a["world_size"] == P, "mode / world_size")
    check("4*H_q*D" in a["flop_convention"], "flop_convention")
    check(a["peak_flops_per_rank"] == 1e12, "peak_flops_per_rank")
    check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", a["start_time_utc"]) is not None, "ISO 8601 start time")
    check(re.fullmatch(r"\d+\.\d+\.\d+", a["hdf5_version"]) is not None, "hdf5_version")
    check(isinstance(a["hostnames"], list) and len(a["hostnames"]) >= 1, "hostnames")
    check(a.get("fixture_note") == "extra attribute", "extra root attribute from Tracer::write_attr")
    check(t.generated is not None and t.generated.shape == (2, 3, 4) and t.generated.dtype == np.int32
          and np.array_equal(t.generated.ravel(), 7 * np.arange(24)), f"/generated {t.generated!r}")

    cfg = t.config
    check(cfg["warmup"] == warmup and type(cfg["warmup"]) is int, f"config warmup {cfg.get('warmup')!r}")
    check(cfg["steps"] == n_steps, "config steps")
    check(type(cfg["watchdog_s"]) is float and type(cfg["csv"]) is bool and cfg["csv"] is False, "typed config")
    check(cfg["out"] == out and isinstance(cfg["strategy"], str), "config strings")

    topo = t.topology
    check(topo["coords"].shape == (P, 4), f"coords shape {topo['coords'].shape}")
    check(list(topo["axis_names"]) == ["dp", "ring", "ulysses", "tp"], f"axis_names {topo['axis_names']}")
    check(list(topo["axis_sizes"]) == [1, P, 1, 1], f"axis_sizes {topo['axis_sizes']}")
    check(list(topo["coords"][:, 1]) == list(range(P)), "ring coordinates")
    check(len(topo["hosts"]) == P and all(isinstance(h, str) for h in topo["hosts"]), "hosts")
    check(list(topo["node_id"]) == [0] * P, "node_id on one host")
    for k in ("clock_offset_us", "clock_offset_error_us", "clock_offset_end_us", "clock_offset_end_error_us"):
        check(topo[k].shape == (P,), f"{k} shape")
    check(topo["clock_offset_us"][0] == 0 and np.all(topo["clock_offset_error_us"] >= 0), "clock offsets")

    check_steps_and_spans(t, P, n_steps)

    s = t.summary
    check(s["warmup_steps_excluded"] == warmup and s["measured_steps"] == n_steps - warmup, "summary counts")
    check(s["valid"] is True and s["valid_reason"] == "", f"summary valid {s.get('valid')} {s.get('valid_reason')}")
    m = t.measured_steps()
    check(len(m) == n_steps - warmup, "measured_steps()")
    for k in ("time_s", "mfu", "tflops_per_rank", "exposed_comm_s"):
        check(np.isclose(s[k + "_median"], np.median(m[k]), rtol=1e-15, atol=0), f"{k}_median")
    check(s["peak_rss_bytes_max"] == t.steps["peak_rss_bytes"].max() > 0, "peak_rss_bytes_max")

    # The CLI prints every step row and the verdict.
    for cmd in ([sys.executable, "-m", "analysis.summary", out],
                [sys.executable, os.path.join(c.source, "analysis", "summary.py"), out]):
        r = subprocess.run(cmd, cwd=c.source, capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, f"{cmd}: rc {r.returncode}\n{r.stderr}")
        rows = [ln for ln in r.stdout.splitlines() if not ln.startswith("#")]
        check(len(rows) == n_steps, f"summary CLI printed {len(rows)} step rows:\n{r.stdout}")
        check("VALID" in r.stdout and "status complete" in r.stdout, f"summary CLI output:\n{r.stdout}")

    # An unknown schema version is refused with a message that names it.
    import h5py
    bad = os.path.join(c.work, "bad_schema.h5")
    shutil.copy(out, bad)
    with h5py.File(bad, "r+") as f:
        f.attrs["schema_version"] = np.int64(999)
    try:
        c.ct.load(bad)
        raise AssertionError("schema_version 999 was accepted")
    except c.ct.SchemaError as e:
        check("999" in str(e) and "supported" in str(e), f"schema error message: {e}")
    r = subprocess.run([sys.executable, "-m", "analysis.summary", bad], cwd=c.source, capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 2 and "999" in r.stderr, f"CLI on a bad schema: rc {r.returncode} {r.stderr}")
    with h5py.File(bad, "r+") as f:
        del f.attrs["schema_version"]
    try:
        c.ct.load(bad)
        raise AssertionError("a file without schema_version was accepted")
    except c.ct.SchemaError:
        raise AssertionError("missing schema_version should be a TraceError, not a SchemaError")
    except c.ct.TraceError as e:
        check("schema_version" in str(e), f"message: {e}")
    try:
        c.ct.load(os.path.join(c.work, "nothing_here.h5"))
        raise AssertionError("a missing file was accepted")
    except FileNotFoundError:
        pass


def case_crash(c: Ctx):
    P, at = 2, 2
    out = os.path.join(c.work, "crash.h5")
    r = c.run_fixture(P, 120, out=out, steps=6, warmup=1, mode="crash", at=at)
    check(r.returncode != 0, "the crashing fixture exited 0")
    check(not os.path.exists(out), "NAME.h5 exists after a crash")
    check(os.path.isfile(out + ".partial"), "NAME.h5.partial missing after a crash")
    t = c.ct.load(out)  # falls back to the .partial
    check(t.partial and t.path == out + ".partial", "loader did not read the .partial")
    check(t.status == "running", f"status {t.status}")
    check(t.steps_completed == at + 1, f"steps_completed {t.steps_completed}, expected {at + 1}")
    check(t.summary == {}, "an unfinished run has no summary")
    check_steps_and_spans(t, P, at + 1)
    r = subprocess.run([sys.executable, "-m", "analysis.summary", out + ".partial"], cwd=c.source,
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "unfinished" in r.stdout, f"summary CLI on .partial:\n{r.stdout}{r.stderr}")


def case_signal(c: Ctx):
    P, max_steps = 2, 400  # >= 50 ms per step: ~20 s if the signal were ignored
    out = os.path.join(c.work, "signal.h5")
    pid_dir = os.path.join(c.work, "pids")
    env = dict(c.env)
    env.update({"CTXPAR_FIXTURE_OUT": out, "CTXPAR_FIXTURE_MODE": "wait_signal",
                "CTXPAR_FIXTURE_STEPS": str(max_steps), "CTXPAR_FIXTURE_PIDDIR": pid_dir,
                "CTXPAR_FIXTURE_WARMUP": "1"})
    proc = subprocess.Popen(c.command(P), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = os.path.join(pid_dir, f"rank{P - 1}.pid")
    deadline = time.time() + 60
    while not os.path.isfile(pid_file):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            out_s, err_s = proc.communicate()
            raise AssertionError(f"fixture never wrote {pid_file}:\n{out_s}\n{err_s}")
        time.sleep(0.05)
    with open(pid_file) as f:
        pid = int(f.read())
    time.sleep(0.3)  # a few more steps
    os.kill(pid, signal.SIGTERM)  # one rank only, as a scheduler's signal might reach it first
    try:
        out_s, err_s = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the job did not stop after SIGTERM")
    check(proc.returncode == 0, f"rc {proc.returncode} after SIGTERM:\n{out_s}\n{err_s}")
    check(os.path.isfile(out) and not os.path.exists(out + ".partial"), "file not renamed after a signal")
    t = c.ct.load(out)
    check(t.status == "truncated", f"status {t.status}")
    n = t.steps_completed
    check(1 <= n < max_steps, f"steps_completed {n}")
    check_steps_and_spans(t, P, n)
    check(t.summary["steps_total"] == n, "summary steps_total")


def case_watchdog(c: Ctx):
    P, at = 2, 1
    out = os.path.join(c.work, "watchdog.h5")
    t0 = time.time()
    try:
        # The stalled rank sleeps 120 s; only the watchdog can end the job sooner.
        r = c.run_fixture(P, 100, out=out, steps=5, mode="hang", at=at, rank=P - 1, watchdog_s=1)
    except subprocess.TimeoutExpired:
        raise AssertionError("the watchdog did not abort a stalled job within 100 s")
    elapsed = time.time() - t0
    text = r.stdout + r.stderr
    check(r.returncode != 0, "a stalled job exited 0")
    pattern = r"\[rank (\d+)/\d+ [^\]]*\] ctxpar: watchdog: no progress for ([0-9.]+) s at step (\d+), layer (-?\d+), phase (\w+)"
    found = list(re.finditer(pattern, text))
    check(found, f"no watchdog message in the output:\n{text}")
    # The stalled rank's own report names where it stopped (the others report where they wait).
    m = next((f for f in found if int(f.group(1)) == P - 1), found[0])
    check(int(m.group(3)) == at and int(m.group(4)) == 1 and m.group(5) == "attn_fwd",
          f"watchdog message names the wrong place: {m.group(0)}")
    check(1.0 <= float(m.group(2)) < 20.0, f"idle time {m.group(2)} s")  # loose: loaded CI machines
    check(elapsed < 90, f"job took {elapsed:.1f} s to abort (the stall lasts 120 s)")
    # The flushed steps before the stall are in the .partial, marked failed with the reason.
    t = c.ct.load(out)
    check(t.partial and t.status == "failed" and t.steps_completed == at, f"partial trace after abort: {t.status} {t.steps_completed}")
    check("watchdog: no progress" in str(t.attrs.get("failure", "")), f"failure attribute: {t.attrs.get('failure')!r}")


CASES = {"loader": case_loader, "crash": case_crash, "signal": case_signal, "watchdog": case_watchdog}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--case", required=True, choices=sorted(CASES))
    p.add_argument("--fixture", required=True, help="path of the test_trace_fixture binary")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--source", required=True, help="repository root (for analysis/)")
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    c = Ctx(args)
    try:
        CASES[args.case](c)
    except AssertionError as e:
        print(f"FAIL trace/{args.case}: {e}", file=sys.stderr)
        return 1
    print(f"PASS trace/{args.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
