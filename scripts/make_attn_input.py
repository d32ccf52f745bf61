#!/usr/bin/python3
"""An input file for `ctxpar attn in=FILE`: q [S, H_q, D], k and v [S, H_kv, D], do [S, H_q, D]
(float32, standard normal times --scale), optional doc_id [S] (int32, packed documents), and the
root attributes causal and window, as src/modes/attn_mode.cpp reads them.

    /usr/bin/python3 scripts/make_attn_input.py mine.h5 --seq 4096 --heads 8 --kv-heads 2 --head-dim 64
    mpirun -np 4 --oversubscribe build/ctxpar attn in=mine.h5 out=result.h5 strategy=ring
Replace any dataset with your own tensors of the same shape (h5py), e.g. a model's captured Q, K, V.
"""
import argparse
import os
import sys

import h5py
import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the HDF5 file to write (refused when it exists)")
    p.add_argument("--seq", type=int, default=4096, help="S, tokens (default 4096)")
    p.add_argument("--heads", type=int, default=8, help="H_q, query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=8, help="H_kv, key/value heads dividing --heads (default 8)")
    p.add_argument("--head-dim", type=int, default=64, help="D (default 64)")
    p.add_argument("--docs", default="", help="packed document lengths summing to --seq, e.g. 1000,3096")
    p.add_argument("--no-causal", action="store_true", help="attributes causal = 0 (every key visible)")
    p.add_argument("--window", type=int, default=0, help="sliding window in tokens (0 = none; causal only)")
    p.add_argument("--scale", type=float, default=1.0, help="standard deviation of the values (default 1)")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if min(a.seq, a.heads, a.kv_heads, a.head_dim) < 1 or a.heads % a.kv_heads:
        p.error("--seq, --heads, --kv-heads and --head-dim must be >= 1, and --kv-heads must divide --heads")
    if a.window < 0 or (a.window and a.no_causal):
        p.error("--window must be >= 0, and a window needs a causal mask")
    if os.path.exists(a.out):
        p.error(f"{a.out} exists; give a new file name")
    rng = np.random.default_rng(a.seed)
    with h5py.File(a.out, "w") as f:
        for name, heads in (("q", a.heads), ("k", a.kv_heads), ("v", a.kv_heads), ("do", a.heads)):
            f[name] = (a.scale * rng.standard_normal((a.seq, heads, a.head_dim))).astype(np.float32)
        if a.docs:
            lengths = [int(x) for x in a.docs.split(",")]
            if min(lengths) < 1 or sum(lengths) != a.seq:
                p.error(f"--docs lengths must be >= 1 and sum to --seq = {a.seq} (they sum to {sum(lengths)})")
            f["doc_id"] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        f.attrs["causal"] = np.int64(0 if a.no_causal else 1)
        f.attrs["window"] = np.int64(a.window)
    print(f"{a.out}: S={a.seq} H_q={a.heads} H_kv={a.kv_heads} D={a.head_dim}"
          f"{' docs=' + a.docs if a.docs else ''} causal={0 if a.no_causal else 1} window={a.window}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
