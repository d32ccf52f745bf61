"""Oracle test of `ctxpar train` (docs/DESIGN.md §6): the same model in PyTorch (llama_torch.py)
judges every training step from ctxpar's own state before it (the oracle dump: per step the
weights and AdamW moments before the step and its gradients; src/modes/oracle_dump.hpp).

The rule (tests/README.md, "The oracle rule"): step s is judged alone, so that no step's rounding
is carried into the next through AdamW (which divides by sqrt(v) and amplifies a difference where
v is small: a multi-step trajectory compared with PyTorch's own trajectory passed or failed with
the seed and the CPU).
- Forward and backward of step s: ctxpar's loss (and step 0's logits) and every gradient against
  the PyTorch model run from ctxpar's weights before step s on step s's sample, in fp64 (the
  reference) and in the naive precision (fp32; bf16 on the GPU path).
- The update of step s: ctxpar's weights and moments after it against AdamW applied in fp64 to
  ctxpar's weights, moments and gradients before it (weights compared as the change of the step,
  W_{s+1} - W_s), the naive computation the same AdamW in fp32 (the GPU path's AdamW is fp32 too).
Each quantity passes when its error against fp64 is at most FACTOR times the naive error plus an
absolute floor of 1e-6 times the quantity's magnitude (per tensor: max-abs error over max |ref|).
FACTOR = 4 on the CPU: two fp32 stacks with different reduction orders (blocked GEMMs and flash
attention here, PyTorch's GEMMs there), and one realization of the naive error underestimates the
spread between them; 2 on the GPU path for the forward and backward (the bf16 policy).

--mutants: after the checks pass, wrong results are fed to the same checks, each of which must
then fail (a gradient 0.1 % too large in one tensor, one element of a gradient off, the learning
rate 1 % too high, the second moment's bias correction skipped, weight decay on a norm weight):
the rule can fail.

--steps N: run and judge N steps (default 5).

usage: test_train_oracle.py CTXPAR MPIRUN [--mutants] [--steps N] --case NAME NP CONFIG [key=value ...] [--case ...]
(cases.py: a group of cases in one interpreter; every case at seq=128 unless its settings say otherwise)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import llama_torch  # noqa: E402

FACTOR = 4.0
UPDATE_FACTOR = 4.0  # the AdamW update: two fp32 evaluations of one elementwise formula
FLOOR = 1e-6
STEPS = 5


def rel_err(a, ref):
    ref = np.asarray(ref, dtype=np.float64)
    mag = max(np.max(np.abs(ref)), 1e-30)
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - ref)) / mag)


class Judge:
    """Collects (quantity, error, naive error, tolerance, ok) rows."""

    def __init__(self):
        self.rows = {}

    def check(self, what, mine, ref, naive, factor):
        e, en = rel_err(mine, ref), rel_err(naive, ref)
        tol = factor * en + FLOOR
        self.rows[what] = (e, en, tol, e <= tol)
        return e <= tol

    def failures(self):
        return [k for k, r in self.rows.items() if not r[3]]


def forward_backward(d, params, step, dtype, bf16_inputs=False):
    """Loss, logits and every gradient of the PyTorch model from `params` on step `step`'s sample."""
    m = llama_torch.Model(d, dtype, bf16_inputs, params=params)
    m.set_batch(step)
    loss, logits = m.forward()
    loss.backward()
    return loss.item(), logits.detach().double().numpy(), {n: m.p[n].grad.double().numpy().copy() for n in m.names}


def check_forward_backward(j, d, s, grads, loss, ref, naive, factor, logits=None):
    """Step s's loss, gradients (and logits) from ctxpar's weights before it."""
    j.check(f"step {s} loss", [loss], [ref[0]], [naive[0]], factor)
    if logits is not None:
        j.check(f"step {s} logits", logits, ref[1], naive[1], factor)
    for n in d["names"]:
        j.check(f"step {s} grad {n}", grads[n], ref[2][n], naive[2][n], factor)


def check_update(j, d, s, before, after):
    """Step s's update: ctxpar's weights and moments after it against AdamW in fp64 (and fp32, the
    naive run) from ctxpar's weights, moments and gradients before it."""
    names, cfg = d["names"], d["cfg"]
    ins = (before["params"], before["adam_m"], before["adam_v"], before["grads"], s + 1)
    r64 = llama_torch.adamw_step(cfg, names, *ins, np.float64)
    r32 = llama_torch.adamw_step(cfg, names, *ins, np.float32)
    for n in names:
        w0 = before["params"][n].astype(np.float64)
        j.check(f"step {s} update {n}", after["params"][n] - w0, r64[0][n] - w0, r32[0][n].astype(np.float64) - w0,
                UPDATE_FACTOR)
        j.check(f"step {s} adam_m {n}", after["adam_m"][n], r64[1][n], r32[1][n], UPDATE_FACTOR)
        j.check(f"step {s} adam_v {n}", after["adam_v"][n], r64[2][n], r32[2][n], UPDATE_FACTOR)


def run_ctxpar(ctxpar, mpirun, np_, config, extra, tmp, steps):
    dump = os.path.join(tmp, "dump.h5")
    cmd = [mpirun, "-np", np_, "--oversubscribe", "--bind-to", "none", ctxpar, "train", "--config", config,
           f"steps={steps}", "warmup=0", "peak_tflops_per_rank=1", f"dump_init={dump}", f"out={os.path.join(tmp, 'trace.h5')}"] + extra
    # an OpenMPI session directory of the case's own: cases run side by side (cases.py)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_orte_tmpdir_base=os.path.join(tmp, "ompi"))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    print(r.stdout[-3000:])
    if r.returncode != 0:
        print(r.stderr[-3000:])
        print("FAIL: ctxpar train exited with", r.returncode)
        return None
    return llama_torch.load_dump(dump)


def mutants(d, refs, factor):
    """Wrong results fed to the same checks: the names of those the checks did not catch."""
    names, steps = d["names"], d["steps"]
    s = min(2, len(refs) - 1)
    big = max(names, key=lambda n: steps[s]["grads"][n].size)
    norm = next(n for n in names if n.endswith("norm"))
    missed = []

    def grads_with(change):
        g = {n: steps[s]["grads"][n].copy() for n in names}
        change(g)
        return g

    def bumped(g):
        flat = g[big].reshape(-1)
        flat[np.argmax(np.abs(flat))] += 1e-3 * np.max(np.abs(flat))

    def verdict(what, j):
        worst = max(e / tol for e, _, tol, _ in j.rows.values())
        print(f"mutant '{what}': {'caught' if j.failures() else 'MISSED'}, worst error {worst:.1f}x its tolerance")
        if not j.failures():
            missed.append(what)

    for what, g in [("a gradient 0.1 % too large", grads_with(lambda g: g.__setitem__(big, g[big] * 1.001))),
                    ("one gradient element off by 1e-3 of the largest", grads_with(bumped))]:
        j = Judge()
        check_forward_backward(j, d, s, g, d["losses"][s], refs[s][0], refs[s][1], factor)
        verdict(what, j)
    before, after = steps[s], steps[s + 1]
    cfg = d["cfg"]
    t = lambda x: np.asarray(x, dtype=np.float32)
    bad = {}
    # the learning rate 1 % high: the step's change 1.01 times ctxpar's
    bad["learning rate 1 % high"] = {n: t(before["params"][n] + 1.01 * (after["params"][n] - before["params"][n]))
                                     for n in names}
    # the second moment's bias correction skipped (from ctxpar's own moments after the step)
    bc1 = 1 - cfg["beta1"] ** (s + 1)
    bad["second-moment bias correction skipped"] = {
        n: t(before["params"][n] * (1.0 if n.endswith(llama_torch.NO_DECAY) else 1 - cfg["lr"] * cfg["weight_decay"])
             - cfg["lr"] / bc1 * after["adam_m"][n] / (np.sqrt(after["adam_v"][n]) + cfg["adam_eps"])) for n in names}
    # weight decay applied to a norm weight too
    wd = {n: after["params"][n].copy() for n in names}
    wd[norm] = t(after["params"][norm] - cfg["lr"] * cfg["weight_decay"] * before["params"][norm])
    bad["weight decay on " + norm] = wd
    for what, params in bad.items():
        j = Judge()
        check_update(j, d, s, before, dict(after, params=params))
        verdict(what, j)
    return missed


def run_case(ctxpar, mpirun, flags, np_, config, settings):
    extra = ["seq=128"] + settings
    with_mutants = "--mutants" in flags
    steps = int(flags[flags.index("--steps") + 1]) if "--steps" in flags else STEPS
    factor, naive_dtype, naive_name, bf16 = FACTOR, torch.float32, "fp32", False
    if "device=cuda" in extra:  # the bf16 policy: the naive forward and backward in bf16, factor 2
        factor, naive_dtype, naive_name, bf16 = 2.0, torch.bfloat16, "bf16", True
    with tempfile.TemporaryDirectory() as tmp:
        d = run_ctxpar(ctxpar, mpirun, np_, config, extra, tmp, steps)
    if d is None:
        return 1
    torch.manual_seed(0)
    j = Judge()
    states = d["steps"]  # the state before each recorded step, and after the last
    n = len(states) - 1  # steps with gradients and the state after them
    refs = []
    for s in range(n):
        p = states[s]["params"]
        ref, naive = forward_backward(d, p, s, torch.float64), forward_backward(d, p, s, naive_dtype)
        refs.append((ref, naive))
        check_forward_backward(j, d, s, states[s]["grads"], d["losses"][s], ref, naive, factor,
                               logits=d["logits"] if s == 0 else None)
        check_update(j, d, s, states[s], states[s + 1])
    failures = j.failures()
    if n < steps or len(d["losses"]) < steps:
        failures.append(f"ctxpar recorded {n} of {steps} steps")
    print(f"{'quantity':40s} {'err vs fp64':>12s} {'naive':>12s} {'tolerance':>12s}   (naive: {naive_name} forward and "
          f"backward, fp32 AdamW)")
    worst = sorted(j.rows.items(), key=lambda kv: -kv[1][0] / kv[1][2])
    for k, (e, en, tol, ok) in [kv for kv in j.rows.items() if not kv[1][3]] + worst[:12]:
        print(f"{k:40s} {e:12.3e} {en:12.3e} {tol:12.3e} {'ok' if ok else 'FAIL'}")
    print(f"... the {min(12, len(worst))} closest to their tolerance of {len(j.rows)} quantities over {n} steps")
    ratio = lambda pick: max([e / max(en, 1e-300) for k, (e, en, _, _) in j.rows.items() if pick(k)] or [0])
    print(f"largest error / naive error: forward and backward {ratio(lambda k: ' update ' not in k and ' adam_' not in k):.2f}, "
          f"update {ratio(lambda k: ' update ' in k or ' adam_' in k):.2f}; largest error / tolerance "
          f"{max(e / tol for e, _, tol, _ in j.rows.values()):.2f}")
    print("losses ctxpar:", " ".join(f"{x:.6f}" for x in d["losses"][:steps]))
    if failures:
        print("FAIL:", ", ".join(failures))
        return 1
    if with_mutants:
        missed = mutants(d, refs, factor)
        if missed:
            print("FAIL: the rule did not catch:", ", ".join(missed))
            return 1
        print("mutants: every wrong gradient and update was caught")
    print(f"PASS: {len(j.rows)} quantities within the oracle rule")
    return 0


def main():
    return cases.run_all(sys.argv, run_case)


if __name__ == "__main__":
    sys.exit(main())
