#!/usr/bin/env python3
"""Faults of a running job, each against the real program under mpirun. Every case ends the job
within its time limit, keeps every completed step readable and leaves the status true:

  signal_rank     SIGUSR1 to rank 2 of 4: every rank stops after the same step (within one step of
                  the signal), trace "truncated" naming signal and rank, exit code 128 + 10
  usr1_mpirun     SIGUSR1 to mpirun (forwarded at once): the same, within one step
  sigterm_mpirun  SIGTERM to mpirun: OpenMPI 4.1 passes it on after odls_base_sigkill_timeout
                  seconds and sends SIGKILL as long again later; with that set above a step's time
                  the run ends truncated (the step bound is mpirun's delay, not checked)
  concurrent      a second job on the same out= exits 2 at once naming the first (host, pid); the
                  first job's files are untouched and it ends intact (stopped by SIGUSR1)
  partial_written another process writes into NAME.partial mid-run: not placed as the trace, exit 3
  out_removed     the earlier trace at out= removed mid-run: the new one is placed there
  early_signal    SIGUSR1 to both ranks once they catch it (start of main): recorded, predict runs on
  stopped_rank    SIGSTOP to rank 1 of 3: the watchdog ends the job (exit 3), the trace is
                  NAME.h5.partial with status "failed" and the reason
  stopped_at_startup  SIGSTOP to rank 1 as soon as it exists (MPI_Init, validation): the start-up
                  watchdog ends the job (exit 3) within watchdog_s
  non_finite      a step whose gradient overflows stops before the update (exit 3), naming step and
                  tensor; the last good checkpoint is untouched
  out_of_memory   an allocation the node cannot give (an address-space limit stands for a small
                  node): one message, exit 3, trace "failed", no backtrace
  disk_full       the checkpoint's file system fills up, with the serial and with the parallel writer:
                  exit 3, the trace (elsewhere) says "failed" with the cause, the last complete
                  checkpoint is still there and whole
  trace_disk_full the trace's own file system fills up: the run stops while the file is whole
                  (exit 3, "failed", every completed step readable)
  side_links      NAME.partial and NAME.lock left as a symlink and a hard link to a user's files:
                  the run completes and those files are untouched

Usage: test_faults.py CTXPAR_BINARY REPO_ROOT --case NAME"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           HDF5_USE_FILE_LOCKING="FALSE")  # reading a live .partial (the writer holds the file)
BACKTRACE = ("Signal:", "terminate called", "Backtrace", "[ 0] ")


class Skip(Exception):
    pass


class Ctx:
    def __init__(self, args):
        self.binary = os.path.abspath(args.binary)
        self.root = os.path.abspath(args.root)
        self.tiny = os.path.join(self.root, "inputs", "tiny.toml")
        self.work = tempfile.mkdtemp(prefix="ctxpar-fault-")
        sys.path.insert(0, self.root)
        from analysis import ctxpar_trace
        self.ct = ctxpar_trace

    def cmd(self, np_, args):
        return ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", self.binary] + args

    def start(self, np_, args):
        return subprocess.Popen(self.cmd(np_, args), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=self.work)

    def run(self, np_, args, timeout=120):
        return subprocess.run(self.cmd(np_, args), env=ENV, capture_output=True, text=True, timeout=timeout,
                              cwd=self.work)

    def steps_flushed(self, out):
        """Steps in the live NAME.h5.partial (0 while it cannot be read yet)."""
        try:
            return self.ct.load(out + ".partial").steps_completed
        except Exception:
            return 0

    def wait_steps(self, p, out, n, limit_s=120):
        t0 = time.time()
        while time.time() - t0 < limit_s:
            if p.poll() is not None:
                raise AssertionError(f"the job ended before {n} steps:\n{p.stdout.read()}\n{p.stderr.read()}")
            k = self.steps_flushed(out)
            if k >= n:
                return k
            time.sleep(0.05)
        p.kill()
        raise AssertionError(f"the job did not flush {n} steps in {limit_s} s")


def rank_pids(mpirun_pid):
    """world rank -> pid of the ctxpar processes started by mpirun."""
    out = {}
    for pid in subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout.split():
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(kv.split(b"=")[1])] = int(pid)
    return out


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def finish(p, limit_s):
    try:
        out, err = p.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"the job did not end within {limit_s} s")
    for b in BACKTRACE:
        check(b not in out + err, f"'{b}' in the job's output (a backtrace):\n{err[-3000:]}")
    return out, err


# Steps slow enough (~0.2-0.5 s at seq=8K on 2 shared cores) that "within one step" can be
# measured. OpenMPI 4.1's mpirun forwards SIGUSR1 at once (measured: 0.03 s); a SIGTERM it turns
# into its kill sequence: SIGTERM to the ranks odls_base_sigkill_timeout seconds later (default
# 1), SIGKILL as long again after that. A step longer than that timeout is killed mid-way, so
# the SIGTERM case raises it.
SLOW = ["seq=8K", "steps=100000", "warmup=0", "watchdog_s=120"]


def signal_case(c, np_, victim, signame, env=None):
    out = os.path.join(c.work, "sig.h5")
    p = subprocess.Popen(c.cmd(np_, ["train", "--config", c.tiny, "out=" + out] + SLOW), env=dict(ENV, **(env or {})),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.work)
    c.wait_steps(p, out, 3)
    pids = rank_pids(p.pid)
    n0 = c.steps_flushed(out)
    if victim == "mpirun":
        os.kill(p.pid, getattr(signal, signame))
    else:
        check(victim in pids, f"rank {victim} not found among {pids}")
        os.kill(pids[victim], getattr(signal, signame))
    t_sig = time.time()
    _, err = finish(p, 120)
    dt = time.time() - t_sig
    check(os.path.isfile(out) and not os.path.exists(out + ".partial"), "the truncated trace was not renamed")
    t = c.ct.load(out)
    check(t.status == "truncated", f"status {t.status!r}, expected 'truncated'")
    n = t.steps_completed
    # The step running when the signal came, plus one for reading the live file a bit late.
    if signame != "SIGTERM" or victim != "mpirun":
        check(n0 <= n <= n0 + 2, f"{n} steps completed, {n0} were flushed when the signal came: more than one step after it")
    who = f"on rank {victim}" if victim != "mpirun" else signame
    check(signame in str(t.attrs.get("stop_reason", "")) and who in str(t.attrs.get("stop_reason", "")),
          f"stop_reason {t.attrs.get('stop_reason')!r}")
    check("TRUNCATED" in err, "no TRUNCATED line on stderr")
    if victim != "mpirun":  # mpirun's own exit status when it is signalled is mpirun's business
        check(p.returncode == 128 + getattr(signal, signame), f"exit code {p.returncode}, expected 128 + {signame}")
    else:
        check(p.returncode != 0, f"exit code 0 after {signame}")
    print(f"{signame} to {victim}: {n} steps ({n0} flushed at the signal), job ended {dt:.1f} s later, rc {p.returncode}")


def case_signal_rank(c):
    signal_case(c, 4, 2, "SIGUSR1")


def case_three_signals(c):
    """Three signals on three ranks within one step: stop_reason names each, the exit code the largest."""
    out = os.path.join(c.work, "sig3.h5")
    p = subprocess.Popen(c.cmd(3, ["train", "--config", c.tiny, "out=" + out] + SLOW), env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.work)
    c.wait_steps(p, out, 2)
    pids = rank_pids(p.pid)
    check(len(pids) == 3, f"ranks found: {pids}")
    sent = [(0, "SIGUSR1"), (1, "SIGUSR2"), (2, "SIGHUP")]
    for rank, name in sent:
        os.kill(pids[rank], getattr(signal, name))
    _, err = finish(p, 120)
    t = c.ct.load(out)
    reason = str(t.attrs.get("stop_reason", ""))
    for rank, name in sent:
        check(f"{name} on rank {rank}" in reason, f"stop_reason {reason!r} does not name {name} on rank {rank}")
    check(p.returncode == 128 + signal.SIGUSR2, f"exit code {p.returncode}, expected 128 + SIGUSR2")
    check("TRUNCATED" in err, "no TRUNCATED line on stderr")
    print(f"stop_reason: {reason}")


def case_usr1_mpirun(c):
    signal_case(c, 2, "mpirun", "SIGUSR1")


def case_sigterm_mpirun(c):
    signal_case(c, 2, "mpirun", "SIGTERM", {"OMPI_MCA_odls_base_sigkill_timeout": "8"})


def case_concurrent(c):
    out = os.path.join(c.work, "shared.h5")
    # The first job runs until told to stop (a fixed step count could end before the second starts).
    a = c.start(2, ["train", "--config", c.tiny, "out=" + out, "seq=4K", "steps=100000", "warmup=0"])
    c.wait_steps(a, out, 2)
    pid0 = rank_pids(a.pid).get(0)
    before = os.stat(out + ".partial").st_ino
    t0 = time.time()
    b = c.run(2, ["train", "--config", c.tiny, "out=" + out, "steps=2"], timeout=60)
    dt = time.time() - t0
    check(b.returncode == 2, f"second job exit code {b.returncode}, expected 2:\n{b.stderr}")
    check(dt < 10, f"the second job took {dt:.1f} s to refuse")
    msg = [l for l in b.stderr.splitlines() if l.startswith("ctxpar: error:")]
    check(len(msg) == 1 and "another job" in msg[0] and f"pid {pid0}" in msg[0],
          f"the message does not name the first job (rank 0 pid {pid0}):\n{b.stderr}")
    check(os.path.exists(out + ".partial") and os.stat(out + ".partial").st_ino == before,
          "the first job's .partial was replaced")
    n0 = c.steps_flushed(out)
    os.kill(a.pid, signal.SIGUSR1)  # mpirun forwards it: the first job ends truncated, intact
    finish(a, 300)
    check(a.returncode == 128 + signal.SIGUSR1, f"first job exit code {a.returncode}")
    t = c.ct.load(out)
    check(t.status == "truncated" and t.steps_completed >= n0 and len(t.steps) == t.steps_completed,
          f"first job's trace: {t.status}, {t.steps_completed} steps ({n0} flushed before)")
    check(not os.path.exists(out + ".lock"), "lock file left after the job ended")
    print(f"second job refused in {dt:.1f} s: {msg[0]}")


def case_out_appears(c):
    """A file the user puts at out= while the run goes on is kept; the trace goes beside it (exit 3)."""
    out = os.path.join(c.work, "appears.h5")
    a = c.start(2, ["train", "--config", c.tiny, "out=" + out, "seq=4K", "steps=100000", "warmup=0"])
    c.wait_steps(a, out, 2)
    with open(out, "w") as f:
        f.write("my notes\n")
    os.kill(a.pid, signal.SIGUSR1)  # ends the run after this step: it then places its trace
    _, err = finish(a, 300)
    check(a.returncode == 3, f"exit code {a.returncode}, expected 3:\n{err[-2000:]}")
    with open(out) as f:
        check(f.read() == "my notes\n", "the user's file was replaced")
    beside = [n for n in os.listdir(c.work) if n.startswith("appears.ctxpar-") and n.endswith(".h5")]
    check(len(beside) == 1, f"no one trace beside it: {os.listdir(c.work)}")
    msg = [l for l in err.splitlines() if "kept as it is" in l]
    check(msg and beside and beside[0] in msg[0], f"no message naming both files:\n{err[-2000:]}")
    no_abort(err, "kept as it is")
    check(not os.path.exists(out + ".lock"), "the output's lock was left behind")
    if beside:
        t = c.ct.load(os.path.join(c.work, beside[0]))
        check(t.status == "truncated" and t.steps_completed >= 2, f"the trace beside: {t.status}, {t.steps_completed}")
    print(msg[0] if msg else "")


def case_partial_written(c):
    """Another process writes into NAME.partial (same file) mid-run: never placed as the trace; exit 3."""
    out = os.path.join(c.work, "written.h5")
    a = c.start(2, ["train", "--config", c.tiny, "out=" + out, "seq=4K", "steps=100000", "warmup=0"])
    c.wait_steps(a, out, 2)
    with open(out + ".partial", "w") as f:  # the same inode, emptied: the steps written are gone
        f.write("x")
    os.kill(a.pid, signal.SIGUSR1)
    _, err = finish(a, 300)
    check(a.returncode == 3, f"exit code {a.returncode}, expected 3:\n{err[-2000:]}")
    check(not os.path.exists(out), "a damaged trace was placed at the output's name")
    no_abort(err, "written into by another process")
    check(not os.path.exists(out + ".lock"), "the output's lock was left behind")
    print([l for l in err.splitlines() if "written into" in l][0][:200])


def case_out_removed(c):
    """The earlier trace at out= removed mid-run: nothing is lost by placing the new one there (exit 0)."""
    out = os.path.join(c.work, "removed.h5")
    r = c.run(1, ["train", "--config", c.tiny, "out=" + out, "steps=1", "warmup=0"])
    check(r.returncode == 0 and os.path.exists(out), f"first run: exit {r.returncode}")
    a = c.start(2, ["train", "--config", c.tiny, "out=" + out, "seq=4K", "steps=100000", "warmup=0"])
    c.wait_steps(a, out, 2)
    os.remove(out)
    os.kill(a.pid, signal.SIGUSR1)
    _, err = finish(a, 300)
    check(a.returncode == 138, f"exit code {a.returncode}, expected 138 (truncated by SIGUSR1):\n{err[-2000:]}")
    t = c.ct.load(out)
    check(not t.partial and t.status == "truncated" and t.steps_completed >= 2, f"trace: {t.status}")
    check("someone else" not in err, f"a removed file was reported as replaced:\n{err[-2000:]}")
    print(f"earlier trace removed mid-run: the new one placed, {t.steps_completed} steps")


def case_early_signal(c):
    """SIGUSR1 to each rank as soon as it catches the signal (its handler is the first thing main
    installs: in MPI_Init or start-up): recorded, never the default action's kill. (A signal within
    the program loader, before main, still kills: the test waits for the handler, /proc SigCgt.)"""
    out = os.path.join(c.work, "early.h5")
    p = c.start(2, ["predict", "--config", c.tiny, "out=" + out, "sweep=seq=1K,2K,4K,8K,16K,32K"])
    sent, t0, before_lock = set(), time.time(), None
    while len(sent) < 2 and time.time() - t0 < 30 and p.poll() is None:
        for r, pid in rank_pids(p.pid).items():
            if r not in sent and catches(pid, signal.SIGUSR1):
                if r == 0:  # installed at main's start: long before rank 0 locks the output
                    before_lock = not os.path.exists(out + ".lock")
                try:
                    os.kill(pid, signal.SIGUSR1)
                    sent.add(r)
                except ProcessLookupError:
                    pass
        time.sleep(0.005)
    _, err = finish(p, 120)
    check(len(sent) == 2, f"signalled {len(sent)} ranks")
    check(before_lock, "rank 0 caught SIGUSR1 only after it locked its output (handlers installed late)")
    check("User defined signal" not in err, f"a rank died of the signal:\n{err[-2000:]}")
    check(p.returncode == 0, f"predict (no steps) runs to its end: exit {p.returncode}\n{err[-2000:]}")
    t = c.ct.load(out)
    check(t.status == "complete", f"trace status {t.status}")
    print("SIGUSR1 at start-up on both ranks: predict ran to its end, status complete")


def catches(pid, sig):
    """True when process `pid` has a handler for `sig` (/proc/PID/status SigCgt)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except OSError:
        pass
    return False


def case_out_dir_moved(c):
    """The output directory renamed mid-run: exit 3, and the moved .partial says failed, not complete."""
    d = os.path.join(c.work, "outdir")
    out = os.path.join(d, "moved.h5")
    a = c.start(2, ["train", "--config", c.tiny, "out=" + out, "seq=4K", "steps=100000", "warmup=0"])
    c.wait_steps(a, out, 2)
    os.rename(d, d + "_moved")
    os.kill(a.pid, signal.SIGUSR1)
    _, err = finish(a, 300)
    check(a.returncode == 3, f"exit code {a.returncode}, expected 3:\n{err[-2000:]}")
    t = c.ct.load(os.path.join(d + "_moved", "moved.h5.partial"))
    check(t.status == "failed" and "no longer where" in str(t.attrs.get("failure")),
          f"the moved trace: {t.status}, {t.attrs.get('failure')!r}")
    no_abort(err, "no longer where")
    print(t.attrs.get("failure"))


def case_stopped_rank(c):
    out = os.path.join(c.work, "stopped.h5")
    p = c.start(3, ["train", "--config", c.tiny, "out=" + out, "seq=3K", "steps=100000", "warmup=0", "watchdog_s=4"])
    c.wait_steps(p, out, 3)
    pids = rank_pids(p.pid)
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.time()
    try:
        _, err = finish(p, 60)
    finally:
        try:
            os.kill(pids[1], signal.SIGKILL)
        except ProcessLookupError:
            pass
    dt = time.time() - t0
    check(p.returncode == 3, f"exit code {p.returncode}, expected 3")
    check(not os.path.exists(out), "a failed run's trace has its final name")
    t = c.ct.load(out)  # the .partial
    check(t.partial and t.status == "failed", f"status {t.status!r}, expected 'failed'")
    check("watchdog" in str(t.attrs.get("failure", "")), f"failure {t.attrs.get('failure')!r}")
    check(t.steps_completed >= 3 and len(t.steps) == t.steps_completed, "completed steps lost")
    check(not os.path.exists(out + ".lock"), "the output's lock was left behind by the aborted job")
    print(f"stopped rank: job ended {dt:.1f} s after SIGSTOP; failure: {t.attrs['failure']}")


def case_stopped_at_startup(c):
    out = os.path.join(c.work, "startup.h5")
    p = c.start(2, ["train", "--config", c.tiny, "out=" + out, "watchdog_s=3"])
    victim, t0 = None, time.time()
    while victim is None and time.time() - t0 < 30:
        victim = rank_pids(p.pid).get(1)
        if victim is None:
            time.sleep(0.005)
    check(victim is not None, "rank 1 never started")
    os.kill(victim, signal.SIGSTOP)
    t0 = time.time()
    try:
        _, err = finish(p, 60)
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    dt = time.time() - t0
    check(p.returncode == 3, f"exit code {p.returncode}, expected 3:\n{err[-2000:]}")
    check("watchdog: no progress" in err, f"no watchdog message:\n{err[-2000:]}")
    check(dt < 30, f"the job took {dt:.1f} s to end (watchdog_s = 3)")
    print(f"stopped at start-up: job ended {dt:.1f} s later, exit 3")


def make_checkpoint(c, name, steps=2):
    ck = os.path.join(c.work, name)
    r = c.run(2, ["train", "--config", c.tiny, f"steps={steps}", "warmup=0", "checkpoint_every=1", "checkpoint=" + ck,
                  "out=" + os.path.join(c.work, "ck_" + name)])
    check(r.returncode == 0, f"checkpoint run failed:\n{r.stderr}")
    return ck


def case_non_finite(c):
    import h5py
    ck = make_checkpoint(c, "big.h5")
    with h5py.File(ck, "r+") as h:  # finite, but the forward overflows with it
        x = h["params/layers.0.wq"][...]
        x[0, 0] = 1e30
        h["params/layers.0.wq"][...] = x
    st = os.stat(ck)
    out = os.path.join(c.work, "nan.h5")
    r = c.run(2, ["train", "--config", c.tiny, "steps=6", "warmup=0", "resume=" + ck, "checkpoint=" + ck,
                  "checkpoint_every=1", "out=" + out])
    check(r.returncode == 3, f"exit code {r.returncode}, expected 3:\n{r.stderr[-2000:]}")
    msg = [l for l in r.stderr.splitlines() if "step 2:" in l]
    check(msg and ("gradient of" in msg[0] or "loss" in msg[0]), f"no message naming step 2 and the tensor:\n{r.stderr}")
    st2 = os.stat(ck)
    check((st.st_size, st.st_mtime_ns) == (st2.st_size, st2.st_mtime_ns), "the last good checkpoint was rewritten")
    t = c.ct.load(out)
    check(t.partial and t.status == "failed" and "step 2" in str(t.attrs.get("failure")),
          f"trace: {t.status}, {t.attrs.get('failure')!r}")
    print(msg[0])


def case_attn_overflow(c):
    """Finite attn inputs whose products overflow fp32: no result file, the result and the input named."""
    import h5py
    import numpy as np
    src = os.path.join(c.work, "huge_q.h5")
    rng = np.random.default_rng(3)
    with h5py.File(src, "w") as h:
        for d in ("q", "k", "v", "do"):
            x = rng.standard_normal((64, 2, 16)).astype(np.float32)
            if d == "q":
                x[5, 1, 3] = 3e38
            h[d] = x
    out = os.path.join(c.work, "huge_res.h5")
    r = c.run(2, ["attn", "in=" + src, "out=" + out])
    check(r.returncode == 3, f"exit code {r.returncode}, expected 3:\n{r.stderr[-2000:]}")
    msg = [l for l in r.stderr.splitlines() if "attn: result" in l]
    check(len(msg) == 1 and "the input made it so" in msg[0] and "|q| 3e+38" in msg[0],
          f"no one message naming the result and the input:\n{r.stderr}")
    check(not os.path.exists(out) and not os.path.exists(out + ".partial"), "a result file was written")
    for b in BACKTRACE:
        check(b not in r.stdout + r.stderr, f"'{b}' in the output")
    print(msg[0] if msg else "")


def case_logits_overflow(c):
    """Finite weights whose products overflow fp32 in the LM head: chat stops at the call, /infer/logits not written."""
    import h5py
    ck = make_checkpoint(c, "huge_head.h5")
    with h5py.File(ck, "r+") as h:
        for n, v in (("params/final_norm", 1e38), ("params/lm_head", 1e30)):
            x = h[n][...]
            x[:] = v
            h[n][...] = x
    out = os.path.join(c.work, "huge_chat.h5")
    r = c.run(2, ["chat", "--config", c.tiny, "docs=none", "resume=" + ck, "save_logits=true",
                  "schedule=prefill:64,decode:2", "out=" + out])
    check(r.returncode == 3, f"exit code {r.returncode}, expected 3:\n{r.stderr[-2000:]}")
    msg = [l for l in r.stderr.splitlines() if "the logits have" in l]
    check(msg and "call 0" in msg[0] and "not written" in msg[0], f"no message naming the call and the logits:\n{r.stderr}")
    t = c.ct.load(out)
    check(t.partial and t.status == "failed", f"trace: {t.status}")
    with h5py.File(out + ".partial", "r") as f:
        check("infer/logits" not in f, "non-finite logits were written")
    no_abort(r.stderr, "the logits have")
    print(msg[0] if msg else "")
    # Without save_logits too: no token is chosen from them (greedy over NaN gave token 0, exit 0).
    out = os.path.join(c.work, "huge_chat_tokens.h5")
    r = c.run(2, ["chat", "--config", c.tiny, "docs=none", "resume=" + ck, "schedule=prefill:64,decode:2", "out=" + out])
    check(r.returncode == 3, f"without save_logits: exit code {r.returncode}, expected 3:\n{r.stderr[-2000:]}")
    no_abort(r.stderr, "logits are not finite")
    t = c.ct.load(out)
    check(t.partial and t.status == "failed" and "no token chosen" in str(t.attrs.get("failure")),
          f"without save_logits: trace {t.status}, {t.attrs.get('failure')!r}")


def case_out_of_memory(c):
    import resource
    if os.environ.get("CTXPAR_SANITIZED") == "1":
        raise Skip("AddressSanitizer reserves terabytes of address space: a limit on it cannot stand for a small node")
    out = os.path.join(c.work, "oom.h5")
    # An address-space limit of 4 GiB per process (inherited by the ranks) stands for a small
    # node: the allocation fails cleanly instead of waking the kernel's OOM killer, which would
    # not spare the other processes of this machine. mem_per_rank lets the plan past the check.
    limit = 4 << 30
    r = subprocess.run(c.cmd(2, ["train", "--config", c.tiny, "seq=16M", "mem_per_rank=1000T", "steps=1", "out=" + out]),
                       env=ENV, capture_output=True, text=True, timeout=120, cwd=c.work,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    text = r.stdout + r.stderr
    check(r.returncode == 3, f"exit code {r.returncode}, expected 3:\n{text[-2000:]}")
    check("out of memory" in r.stderr, "no out-of-memory message")
    for b in BACKTRACE:
        check(b not in text, f"'{b}' in the output")
    t = c.ct.load(out)
    check(t.partial and t.status == "failed" and "out of memory" in str(t.attrs.get("failure")),
          f"trace: {t.status}, {t.attrs.get('failure')!r}")
    check(not os.path.exists(out + ".lock"), "the output's lock was left behind by the aborted job")
    print([l for l in r.stderr.splitlines() if "out of memory" in l][0])


def case_disk_full(c):
    # the serial writer (rank 0 after a gather), then the parallel one (every rank through MPI-IO)
    for io in ("serial", "parallel"):
        disk_full_with(c, io)


def disk_full_with(c, io):
    small = mount_tmpfs(c, "8m", "small_" + io)
    try:
        ck = os.path.join(small, "ck.h5")
        out = os.path.join(c.work, f"full_{io}.h5")
        # One tiny-model checkpoint is 5.3 MB: the first fits, the second (written beside it
        # before the rename) does not.
        r = c.run(2, ["train", "--config", c.tiny, "steps=4", "warmup=0", "checkpoint_every=1", "checkpoint=" + ck,
                      "out=" + out, "checkpoint_io=" + io])
        check(r.returncode == 3, f"exit code {r.returncode}, expected 3:\n{r.stderr[-2000:]}")
        check("no space left" in r.stderr, f"the message does not say the disk is full:\n{r.stderr[-2000:]}")
        no_abort(r.stderr)
        import h5py
        with h5py.File(ck, "r") as h:  # the last complete checkpoint, whole
            check(int(h.attrs["step"]) == 1 and "params/emb" in h, "the last complete checkpoint is damaged")
        check(not os.path.exists(ck + ".partial"), "a partial checkpoint was left on the full disk")
        t = c.ct.load(out)
        check(t.partial and t.status == "failed" and "no space left" in str(t.attrs.get("failure")),
              f"trace: {t.status}, {t.attrs.get('failure')!r}")
        print(f"disk full ({io} writer): {t.attrs['failure']}")
    finally:
        subprocess.run(["umount", small], capture_output=True)


def case_attn_disk_full(c):
    """attn results on a full disk: exit 3, no unreadable .partial left beside them."""
    small = mount_tmpfs(c, "3m")
    try:
        res = os.path.join(small, "res.h5")
        # The trace (res.trace.h5) fits with the 1 MiB it keeps free; the results do not: at seq
        # 4K x 8 heads x 64 each result tensor is 8 MiB.
        r = c.run(2, ["attn", "seq=4K", "out=" + res])
        check(r.returncode == 3, f"exit code {r.returncode}, expected 3:\n{r.stderr[-2000:]}")
        check("I/O error" in r.stderr, f"no I/O error message:\n{r.stderr[-2000:]}")
        no_abort(r.stderr)
        check(not os.path.exists(res + ".partial") and not os.path.exists(res),
              f"a partial result was left on the full disk: {os.listdir(small)}")
        print([l for l in r.stderr.splitlines() if "I/O error" in l][0][:200])
    finally:
        subprocess.run(["umount", small], capture_output=True)


def no_abort(err, said="I/O error"):
    """A fault in rank 0's own write ends every rank alike, without a job abort: one message, none
    of OpenMPI's abort banner or its ORTE_ERROR_LOG lines."""
    for line in ("MPI_ABORT was invoked", "ORTE_ERROR_LOG"):
        check(line not in err, f"'{line}' in the output: the job was aborted\n{err[-2000:]}")
    check(err.count(said) == 1, f"'{said}' is not said once:\n{err[-2000:]}")


def mount_tmpfs(c, size, name="small"):
    d = os.path.join(c.work, name)
    os.makedirs(d)
    if os.geteuid() != 0:
        raise Skip("mounting a small tmpfs needs root")
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", d], capture_output=True, text=True)
    if m.returncode != 0:
        raise Skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")
    return d


def case_trace_disk_full(c):
    small = mount_tmpfs(c, "1600k")
    try:
        out = os.path.join(small, "full.h5")
        r = c.run(2, ["train", "--config", c.tiny, "steps=100000", "warmup=0", "out=" + out], timeout=200)
        check(r.returncode == 3, f"exit code {r.returncode}, expected 3:\n{r.stderr[-2000:]}")
        check("file system is full" in r.stderr, f"no message naming the full file system:\n{r.stderr[-2000:]}")
        t = c.ct.load(out)
        check(t.partial and t.status == "failed" and "full" in str(t.attrs.get("failure")),
              f"trace: {t.status}, {t.attrs.get('failure')!r}")
        check(t.steps_completed >= 5 and len(t.steps) == t.steps_completed, f"{t.steps_completed} steps readable")
        print(f"trace disk full: {t.steps_completed} steps readable; {t.attrs['failure']}")
    finally:
        subprocess.run(["umount", small], capture_output=True)


def case_side_links(c):
    notes, other = os.path.join(c.work, "notes.txt"), os.path.join(c.work, "other.txt")
    for p in (notes, other):
        with open(p, "w") as f:
            f.write("a user's file\n")
    out = os.path.join(c.work, "run.h5")
    os.symlink(notes, out + ".partial")
    os.link(other, out + ".lock")
    r = c.run(2, ["train", "--config", c.tiny, "steps=2", "warmup=0", "out=" + out])
    check(r.returncode == 0, f"exit code {r.returncode}:\n{r.stderr[-2000:]}")
    for p in (notes, other):
        check(open(p).read() == "a user's file\n", f"{p} was written through a link")
    check(os.path.isfile(out) and not os.path.islink(out), "the trace is not a regular file")
    check(c.ct.load(out).status == "complete", "the run did not complete")
    print("stale links at NAME.partial and NAME.lock: removed, their targets untouched")


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("root")
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    args = ap.parse_args()
    c = Ctx(args)
    try:
        CASES[args.case](c)
    except Skip as e:
        print(f"SKIP fault/{args.case}: {e}")
        return 77
    except AssertionError as e:
        print(f"FAIL fault/{args.case}: {e}")
        return 1
    finally:
        shutil.rmtree(c.work, ignore_errors=True)
    print(f"PASS fault/{args.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
