#!/usr/bin/python3
"""`ctxpar attn` end to end: HDF5 input (float64/float32 mix, documents, sliding window) through
every strategy on 4 ranks, results in global token order checked against a numpy fp64
attention forward/backward; generated inputs (written into the output file) checked the same
way; bad input files give exit code 2, a message naming the dataset and the expected shape, and
no output file.

This is a plumbing test (file I/O, sharding, token order): a wrong order or shard gives O(1)
errors. Tolerance: 2e-5 x max|ref| per tensor (fp32 kernels vs fp64 measure ~5e-7 here); the
numerical policy itself is asserted by test_cp.

usage: test_cp_attn_cli.py CTXPAR MPIRUN WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from attn_numpy import max_rel_errors  # noqa: E402

CTXPAR, MPIRUN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
TOL = 2e-5
failures = []


def run(np_, *args):
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np_), CTXPAR, "attn", *args]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def check(label, out_path, in_path):
    for n, (err, msg) in max_rel_errors(out_path, in_path).items():
        if msg:
            failures.append(f"{label}: {msg}")
        elif not err <= TOL:
            failures.append(f"{label}: {n} relative error {err:.2e} > {TOL}")


rng = np.random.default_rng(7)
S, Hq, Hkv, D = 192, 8, 2, 16
inp = os.path.join(WORK, "in.h5")
with h5py.File(inp, "w") as f:
    f["q"] = rng.standard_normal((S, Hq, D))
    f["k"] = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    f["v"] = rng.standard_normal((S, Hkv, D))
    f["do"] = rng.standard_normal((S, Hq, D)).astype(np.float32)
    f["doc_id"] = np.repeat(np.arange(4), [50, 10, 100, 32]).astype(np.int32)
    f.attrs["causal"] = 1
    f.attrs["window"] = 40

# Every strategy on 4 ranks (ulysses with U = 4 > H_kv = 2 replicates K/V heads).
for strategy, mesh in [("allgather", "ring:4"), ("ulysses", "ulysses:4"), ("ring", "ring:4"), ("usp", "ulysses:2,ring:2")]:
    out = os.path.join(WORK, f"out_{strategy}.h5")
    rc, log = run(4, "--in", inp, "--out", out, f"--strategy={strategy}", f"--mesh={mesh}")
    if rc != 0:
        failures.append(f"{strategy}: exit {rc}\n{log}")
        continue
    check(strategy, out, inp)
    if not os.path.exists(os.path.join(WORK, f"out_{strategy}.trace.h5")):
        failures.append(f"{strategy}: trace file out_{strategy}.trace.h5 missing")

# Generated inputs (seed), no mask, packed documents: the output file carries its inputs.
gen = os.path.join(WORK, "gen.h5")
rc, log = run(2, "--out", gen, "--strategy=ring", "--mesh=ring:2", "seq=128", "heads=4", "kv_heads=1", "head_dim=16",
              "mask=none", "docs=30,50,48")
if rc != 0:
    failures.append(f"generated: exit {rc}\n{log}")
else:
    check("generated", gen, gen)

# scripts/make_attn_input.py (the README's way to make an input file): documents and a window.
made = os.path.join(WORK, "made.h5")
if os.path.exists(made):
    os.remove(made)
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make_attn_input.py")
p = subprocess.run([sys.executable, script, made, "--seq", "160", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                    "--docs", "60,100", "--window", "32"], capture_output=True, text=True)
if p.returncode != 0:
    failures.append(f"make_attn_input.py: exit {p.returncode}\n{p.stdout}{p.stderr}")
else:
    out = os.path.join(WORK, "made_out.h5")
    rc, log = run(2, "in=" + made, "out=" + out, "strategy=ring", "mesh=ring:2")
    if rc != 0:
        failures.append(f"made input: exit {rc}\n{log}")
    else:
        check("make_attn_input", out, made)

# Bad inputs: exit 2, one clear message, no output file.
bad_cases = {
    "missing": ({"q": (S, Hq, D), "k": (S, Hkv, D), "v": (S, Hkv, D)}, "dataset 'do' is missing"),
    "shape": ({"q": (S, Hq, D), "k": (S, Hkv, D), "v": (S, Hkv, D + 1), "do": (S, Hq, D)},
              f"dataset 'v' has shape [{S}, {Hkv}, {D + 1}]; expected [{S}, {Hkv}, {D}]"),
    "kshape": ({"q": (S, Hq, D), "k": (S - 1, Hkv, D), "v": (S - 1, Hkv, D), "do": (S, Hq, D)},
               f"dataset 'k' has shape [{S - 1}, {Hkv}, {D}]; expected [S, H_kv, D] = [{S}, H_kv, {D}]"),
    "heads": ({"q": (S, 12, D), "k": (S, 3, D), "v": (S, 3, D), "do": (S, 12, D)},
              "kv_heads H_kv=3 can be neither split over nor replicated on U=4"),
}
for name, (dsets, want) in bad_cases.items():
    path = os.path.join(WORK, f"bad_{name}.h5")
    with h5py.File(path, "w") as f:
        for n, shp in dsets.items():
            f[n] = rng.standard_normal(shp)
    out = os.path.join(WORK, f"bad_{name}_out.h5")
    rc, log = run(4, "--in", path, "--out", out, "--strategy=ulysses", "--mesh=ulysses:4")
    if rc != 2 or want not in log or os.path.exists(out):
        failures.append(f"bad input '{name}': exit {rc} (want 2), output exists: {os.path.exists(out)}, "
                        f"message must contain: {want}\n{log}")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("ctxpar attn CLI: all checks passed")
