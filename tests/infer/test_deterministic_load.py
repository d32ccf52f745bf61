#!/usr/bin/python3
"""deterministic=true under load: the deterministic chats of test_infer_cli.py (a model with Gated
DeltaNet layers at 96-token prefills, one with local and global attention layers) run REPEATS times
on 2 ranks (pass-KV prefills) while every core of the machine is kept busy by other processes, and
every run's generated tokens and saved logits must have the bits of the same chat on 1 rank (run
first, also under the load). Nothing measured or timed may choose a computation under
deterministic=true (docs/DESIGN.md): a choice made from a timing (as BLIS's kernels once were on
Intel CPUs with AVX-512) changes with the load, and with it the bits.

usage: test_deterministic_load.py CTXPAR MPIRUN WORKDIR
"""
import multiprocessing
import os
import subprocess
import sys

import h5py

CTXPAR, MPIRUN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
MODEL = ["layers=2", "dim=64", "ffn_dim=128", "vocab=101", "heads=4", "kv_heads=2", "head_dim=16", "threads=1"]
REPEATS = 5
CHATS = {
    "gdn96": ["batch=3", "layer_pattern=GD", "gdn_chunk=8", "schedule=prefill:96,decode:5,prefill:96,decode:3"],
    "local": ["batch=3", "layer_pattern=GL", "window=24", "schedule=prefill:128,decode:5,prefill:32,decode:3"],
}


def busy():
    while True:
        pass


def chat(name, np_, extra, out):
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np_), CTXPAR, "chat", *MODEL, *CHATS[name],
           "deterministic=true", "save_logits=true", *extra, f"out={out}"]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return None, f"rc {p.returncode}\n{p.stdout[-1500:]}{p.stderr[-1500:]}"
    with h5py.File(out) as f:
        return (f["generated"][:].tobytes(), f["infer/logits"][:].tobytes()), ""


def main():
    load = [multiprocessing.Process(target=busy, daemon=True) for _ in range(os.cpu_count() or 2)]
    for p in load:
        p.start()
    failures = []
    try:
        for name in CHATS:
            ref, err = chat(name, 1, [], os.path.join(WORK, f"{name}_np1.h5"))
            if ref is None:
                failures.append(f"{name} np 1: {err}")
                continue
            for i in range(REPEATS):
                got, err = chat(name, 2, ["cp_algo=pass_kv"], os.path.join(WORK, f"{name}_np2_{i}.h5"))
                if got is None:
                    failures.append(f"{name} np 2 run {i}: {err}")
                    continue
                same = (got[0] == ref[0], got[1] == ref[1])
                print(f"{name} np 2 run {i} under load: tokens {'same bits' if same[0] else 'DIFFER'}, "
                      f"logits {'same bits' if same[1] else 'DIFFER'}", flush=True)
                if not all(same):
                    failures.append(f"{name} np 2 run {i}: not bit-identical to np 1")
    finally:
        for p in load:
            p.terminate()
    for f in failures:
        print("FAIL:", f)
    print(f"{len(CHATS) * REPEATS - len(failures)} of {len(CHATS) * REPEATS} loaded runs bit-identical")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
