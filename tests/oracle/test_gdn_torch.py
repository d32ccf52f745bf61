"""The Gated DeltaNet op against PyTorch: the chunked CPU kernel (kernels/cpu/gdn_cpu.cpp, through
tests/kernels/gdn_dump) against the plain recurrence written here in PyTorch, in fp64 with autograd:
the output, the final state, and the gradients of q, k, v, g, beta and the initial state for
L = sum(d_o * o) + sum(ds_out * s_out). Tolerance policy (tests/README.md): error against fp64 at
most FACTOR times the same recurrence's error in PyTorch fp32, plus 1e-6 x max|reference|;
errors are max-abs over a tensor divided by its max |reference|.

usage: test_gdn_torch.py GDN_DUMP
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

FACTOR = 4.0
FLOOR = 1e-6
# (T, H, Dk, Dv, chunk, docs): one document; packed documents with chunks not dividing them
CASES = [(96, 2, 16, 8, 16, 1), (130, 3, 32, 16, 32, 4), (64, 1, 8, 12, 7, 3)]


def recurrence(q, k, v, g, beta, s0, doc):
    T, H, Dk = q.shape
    scale = 1.0 / math.sqrt(Dk)
    S = s0.clone()
    outs = []
    for t in range(T):
        if t > 0 and doc[t] != doc[t - 1]:
            S = torch.zeros_like(S)
        a = torch.exp(g[t])[:, None]
        u = v[t] - a * torch.einsum("hvk,hk->hv", S, k[t])
        S = a[:, :, None] * S + beta[t][:, None, None] * torch.einsum("hv,hk->hvk", u, k[t])
        outs.append(scale * torch.einsum("hvk,hk->hv", S, q[t]))
    return torch.stack(outs), S


def run(dump, case, seed):
    T, H, Dk, Dv, chunk, docs = case
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([dump, d, str(T), str(H), str(Dk), str(Dv), str(chunk), str(docs), str(seed)], check=True)
        rd = lambda n, dt=np.float32: np.fromfile(os.path.join(d, n + ".bin"), dtype=dt)
        x = {n: rd(n) for n in ["q", "k", "v", "g", "beta", "s0", "d_o", "ds_out", "o", "s_out", "dq", "dk", "dv",
                                "dg", "dbeta", "ds0"]}
        doc = rd("doc", np.int32)
    shapes = {"q": (T, H, Dk), "k": (T, H, Dk), "v": (T, H, Dv), "g": (T, H), "beta": (T, H), "s0": (H, Dv, Dk)}
    res = {}
    for dtype in (torch.float64, torch.float32):
        t = {n: torch.tensor(x[n].reshape(s), dtype=dtype, requires_grad=True) for n, s in shapes.items()}
        o, s_out = recurrence(t["q"], t["k"], t["v"], t["g"], t["beta"], t["s0"], doc)
        L = (o * torch.tensor(x["d_o"].reshape(T, H, Dv), dtype=dtype)).sum() + \
            (s_out * torch.tensor(x["ds_out"].reshape(H, Dv, Dk), dtype=dtype)).sum()
        L.backward()
        res[dtype] = {"o": o.detach().numpy(), "s_out": s_out.detach().numpy(),
                      **{"d" + n: t[n].grad.numpy() for n in shapes}}
    mine = {"o": x["o"], "s_out": x["s_out"], "dq": x["dq"], "dk": x["dk"], "dv": x["dv"], "dg": x["dg"],
            "dbeta": x["dbeta"], "ds0": x["ds0"]}
    failures = []
    for n, m in mine.items():
        r64 = np.asarray(res[torch.float64][n], dtype=np.float64).reshape(-1)
        r32 = np.asarray(res[torch.float32][n], dtype=np.float64).reshape(-1)
        mag = max(np.max(np.abs(r64)), 1e-30)
        e = float(np.max(np.abs(m.astype(np.float64) - r64)) / mag)
        en = float(np.max(np.abs(r32 - r64)) / mag)
        tol = FACTOR * en + FLOOR
        ok = e <= tol
        print(f"  {n:6s} err {e:10.3e}  torch fp32 {en:10.3e}  tol {tol:10.3e}  {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(n)
    return failures


def main():
    dump = sys.argv[1]
    failures = []
    for i, case in enumerate(CASES):
        print("case T=%d H=%d Dk=%d Dv=%d chunk=%d docs=%d" % case)
        failures += [f"{case}: {n}" for n in run(dump, case, 100 + i)]
    if failures:
        print("FAIL:", ", ".join(failures))
        return 1
    print(f"PASS: {len(CASES)} cases, every output and gradient within the tolerance policy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
