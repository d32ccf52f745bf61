#!/usr/bin/env python3
"""PyTorch's CPU flash attention on bench attn's headline shape, for the comparison in docs/measurements.md.

Times torch.nn.functional.scaled_dot_product_attention (the flash-attention CPU kernel, forced
through sdpa_kernel(FLASH_ATTENTION), or --backend default: PyTorch's own choice; GQA by
enable_gqa) forward and backward in fp32 and prints
GFLOP/s by ctxpar's FLOP convention (docs/DESIGN.md section 3: forward 4 * H_q * D per visible
(q, k) pair, backward 2.5 x forward), so the rates compare one to one with `ctxpar bench attn`.

A measurement tool, not a test: it needs PyTorch >= 2.5 (enable_gqa), which Debian 12 does not
ship (its python3-torch is 1.13), e.g. from PyPI in a throwaway virtual environment:
    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch numpy
    /tmp/tv/bin/python kernels/tools/torch_attn_compare.py --threads 2
Run it back to back with `mpirun -np 1 --bind-to none build/ctxpar bench attn threads=2` and
compare rates of the same series of runs (the machine's speed drifts between series).
"""
import argparse
import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3, help="timed iterations after one warm-up")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--backend", choices=["flash", "default"], default="flash",
                    help="flash: force the flash-attention CPU kernel; default: PyTorch's own choice")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    S, Hq, Hkv, D = a.seq, a.heads, a.kv_heads, a.head_dim
    causal = not a.no_causal
    q = torch.randn(1, Hq, S, D, requires_grad=True)
    k = torch.randn(1, Hkv, S, D, requires_grad=True)
    v = torch.randn(1, Hkv, S, D, requires_grad=True)
    do = torch.randn(1, Hq, S, D)
    pairs = S * (S + 1) / 2 if causal else S * S
    fwd_flop = 4.0 * Hq * D * pairs
    fwd_t, bwd_t = [], []
    forced = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if a.backend == "flash" else contextlib.nullcontext()
    with forced:
        for it in range(a.iters + 1):
            q.grad = k.grad = v.grad = None
            t0 = time.perf_counter()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            t1 = time.perf_counter()
            o.backward(do)
            t2 = time.perf_counter()
            if it > 0:
                fwd_t.append(t1 - t0)
                bwd_t.append(t2 - t1)
    f, b = sum(fwd_t) / len(fwd_t), sum(bwd_t) / len(bwd_t)
    print(f"# torch {torch.__version__} scaled_dot_product_attention ({a.backend} backend, CPU, fp32), {a.threads} threads, "
          f"mean of {a.iters} after one warm-up")
    print(f"#      S  H_q H_kv    D    mask    fwd_ms    bwd_ms  fwd_GFLOP/s  bwd_GFLOP/s")
    print(f"{S:8d} {Hq:4d} {Hkv:4d} {D:4d} {'causal' if causal else 'none':>7} {f*1e3:9.1f} {b*1e3:9.1f} "
          f"{fwd_flop / f / 1e9:12.1f} {2.5 * fwd_flop / b / 1e9:12.1f}")


if __name__ == "__main__":
    main()
