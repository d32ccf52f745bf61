"""The ctxpar training model in plain PyTorch (autograd), the oracle for src/model.

Same math as src/model/transformer.cpp, written independently from the PyTorch side:
weights stored [in, out] (y = x @ W), RMSNorm, rotate-half RoPE at global positions with
Llama 3 frequency scaling, GQA by repeating K/V heads, causal + same-document mask, SwiGLU,
cross-entropy over labels shifted within documents (-1 = ignored), AdamW with decoupled weight
decay on matrices only and global-norm clipping (torch.nn.utils.clip_grad_norm_).

Local layers (layer_pattern with L, as Gemma's sliding-window layers): the attention mask also
keeps q_pos - k_pos < window.

Hybrid models (layer_pattern with D): a D layer's token mixer is Gated DeltaNet as published
(short causal depthwise convolutions with silu, L2-normalised q and k, beta = sigmoid, decay
g = -exp(A_log) softplus(a + dt_bias), the gated delta rule run token by token as its plain
recurrence, a gated RMSNorm over each head's output), nothing crossing a document boundary.

Multi-head Latent Attention (attention = "mla", DeepSeek V2/V3 style) replaces the G and L layers'
attention: q from a RMS-normed low-rank latent (or directly when q_lora_rank = 0), K/V from a
RMS-normed kv_lora_rank latent expanded per head, each head's q/k being [nope | rope] with RoPE
(its own tables, over qk_rope_head_dim dims) on the rope part and one rope key shared by all heads,
scores scaled by 1/sqrt(nope + rope), v_head_dim values per head; same masks as mha.
"""
import math

import h5py
import numpy as np
import torch

LAYER_TENSORS = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w1", "w3", "w2"]
GDN_TENSORS = ["attn_norm", "wq", "wk", "wv", "conv_q", "conv_k", "conv_v", "wa", "wb", "a_log", "dt_bias", "wg",
               "o_norm", "wo", "mlp_norm", "w1", "w3", "w2"]
MLA_TENSORS = ["attn_norm", "wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b", "wo", "mlp_norm", "w1", "w3", "w2"]
MLA_TENSORS_NO_Q_LORA = ["attn_norm", "wq", "wkv_a", "kv_norm", "wkv_b", "wo", "mlp_norm", "w1", "w3", "w2"]
NO_DECAY = ("norm", "a_log", "dt_bias")  # by name suffix: covers attn_norm, mlp_norm, o_norm, q_norm, kv_norm


def layer_kinds(cfg):
    pattern = cfg.get("layer_pattern", "G")
    if isinstance(pattern, bytes):
        pattern = pattern.decode()
    return [pattern[l % len(pattern)] for l in range(cfg["layers"])]


def attention_kind(cfg):
    """ "mha" or "mla"; dumps older than MLA carry no "attention" attribute (= "mha")."""
    a = cfg.get("attention", "mha")
    return a.decode() if isinstance(a, bytes) else a


def layer_tensors(cfg, kind):
    """The parameter names of one layer of the given kind ('G', 'L' or 'D'), in dump order."""
    if kind == "D":
        return GDN_TENSORS
    if attention_kind(cfg) == "mla":
        return MLA_TENSORS if cfg["q_lora_rank"] > 0 else MLA_TENSORS_NO_Q_LORA
    return LAYER_TENSORS


def load_dump(path):
    f = h5py.File(path, "r")
    cfg = {k: (f.attrs[k].item() if hasattr(f.attrs[k], "item") else f.attrs[k]) for k in f.attrs}
    cfg = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in cfg.items()}
    names = ["emb"]
    for l, kind in enumerate(layer_kinds(cfg)):
        names += [f"layers.{l}.{t}" for t in layer_tensors(cfg, kind)]
    names += ["final_norm", "lm_head"]
    # steps/<s>/{params,adam_m,adam_v}: the state before step s (and after the last recorded one);
    # steps/<s>/grads: step s's gradients (src/modes/oracle_dump.hpp)
    steps = []
    for s in range(len(f["steps"])):
        g = f[f"steps/{s}"]
        st = {k: {n: np.array(g[f"{k}/{n}"]) for n in names} for k in ("params", "adam_m", "adam_v")}
        if "grads" in g:
            st["grads"] = {n: np.array(g[f"grads/{n}"]) for n in names}
        steps.append(st)
    params, grads = steps[0]["params"], steps[0]["grads"]
    out = dict(cfg=cfg, names=names, steps=steps, params=params, grads=grads, logits=np.array(f["logits"]),
               losses=np.array(f["losses"]).reshape(-1), tokens=np.array(f["tokens"]).reshape(-1, cfg["seq"]),
               doc_ids=np.array(f["doc_ids"]).reshape(-1, cfg["seq"]))
    f.close()
    return out


def rope_inv_freq(cfg, D=None):
    """Llama 3 scaled inverse frequencies over D rotary dims (default head_dim)."""
    if D is None:
        D = cfg["head_dim"]
    theta, factor = cfg["rope_theta"], cfg["rope_scale_factor"]
    low, high, orig = cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"], cfg["rope_original_max_pos"]
    out = []
    for i in range(D // 2):
        f = theta ** (-2.0 * i / D)
        wavelen = 2 * math.pi / f
        if wavelen > orig / low:
            f = f / factor
        elif wavelen >= orig / high and high != low:
            smooth = (orig / wavelen - low) / (high - low)
            f = (1 - smooth) * f / factor + smooth * f
        out.append(f)
    return np.array(out, dtype=np.float64)


def labels_of(tokens, doc_ids):
    lab = np.full(len(tokens), -1, dtype=np.int64)
    same = doc_ids[1:] == doc_ids[:-1]
    lab[:-1][same] = tokens[1:][same]
    return lab


class Model:
    """`dtype`: the parameters' and the arithmetic's type. `bf16_inputs` (with float32): the naive
    bf16 computation of ctxpar's GPU policy: fp32 master weights, AdamW and arithmetic, every GEMM's
    and the attention's input operands rounded to bf16 first, and the attention's unnormalized
    probabilities exp(s - max) before P V (normalized after, by their unrounded sum), as the
    kernels round them (gradients rounded back the same way by autograd
    through the casts)."""

    def __init__(self, dump, dtype, bf16_inputs=False, params=None):
        """`params`: the weights (default the dump's initial ones, dump["params"])."""
        self.cfg = dump["cfg"]
        self.dtype = dtype
        self.bf16_inputs = bf16_inputs
        self.names = dump["names"]
        params = dump["params"] if params is None else params
        self.p = {n: torch.tensor(params[n], dtype=dtype, requires_grad=True) for n in self.names}
        S = self.cfg["seq"]
        pos = np.arange(S, dtype=np.float64)
        ang = np.outer(pos, rope_inv_freq(self.cfg))  # angles in float64, as ctxpar's rope_table
        self.cos = torch.tensor(np.cos(ang), dtype=dtype)
        self.sin = torch.tensor(np.sin(ang), dtype=dtype)
        if attention_kind(self.cfg) == "mla":  # MLA's rope part: its own tables over qk_rope_head_dim dims
            ang_r = np.outer(pos, rope_inv_freq(self.cfg, self.cfg["qk_rope_head_dim"]))
            self.cos_r = torch.tensor(np.cos(ang_r), dtype=dtype)
            self.sin_r = torch.tensor(np.sin(ang_r), dtype=dtype)
        self.dump = dump
        self.set_batch(0)

    def set_batch(self, step):
        S = self.cfg["seq"]
        tokens, doc_ids = self.dump["tokens"][step], self.dump["doc_ids"][step]
        doc = torch.tensor(doc_ids.astype(np.int64))
        causal = torch.arange(S)[None, :] <= torch.arange(S)[:, None]
        self.mask = causal & (doc[None, :] == doc[:, None])
        # Local (L) layers: also within the window, q_pos - k_pos < window.
        near = torch.arange(S)[:, None] - torch.arange(S)[None, :] < max(int(self.cfg.get("window", 0)), 1)
        self.local_mask = self.mask & near
        self.doc = doc
        self.tokens = torch.tensor(tokens.astype(np.int64))
        self.labels = torch.tensor(labels_of(tokens, doc_ids))

    def r(self, x):
        """x rounded to bf16 (as fp32) in the bf16_inputs mode, else x."""
        return x.to(torch.bfloat16).to(x.dtype) if self.bf16_inputs else x

    def mm(self, a, b):
        return self.r(a) @ self.r(b)

    def rms(self, x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.cfg["norm_eps"]) * w.reshape(-1)

    def rope(self, x, cos=None, sin=None):  # x [S, H, D], rotate half; tables [S, D/2] (default self.cos/sin)
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        cos = self.cos if cos is None else cos
        sin = self.sin if sin is None else sin
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)

    def mla(self, x, w, mask):
        """One Multi-head Latent Attention token mixer: x + o Wo."""
        c = self.cfg
        S, H = c["seq"], c["heads"]
        nope, R, V, kl = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        h = self.rms(x, w["attn_norm"])
        if c["q_lora_rank"] > 0:
            qf = self.rms(h @ w["wq_a"], w["q_norm"]) @ w["wq_b"]
        else:
            qf = h @ w["wq"]
        qf = qf.reshape(S, H, nope + R)
        q_pe = self.rope(qf[..., nope:], self.cos_r, self.sin_r)
        ckv = h @ w["wkv_a"]  # [S, kv_lora_rank + rope]
        lat = self.rms(ckv[:, :kl], w["kv_norm"])
        k_pe = self.rope(ckv[:, kl:][:, None, :], self.cos_r, self.sin_r)  # [S, 1, rope], shared by all heads
        kv = (lat @ w["wkv_b"]).reshape(S, H, nope + V)
        q = torch.cat([qf[..., :nope], q_pe], dim=-1)
        k = torch.cat([kv[..., :nope], k_pe.expand(S, H, R)], dim=-1)
        sc = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(nope + R)
        sc = sc.masked_fill(~mask[None], float("-inf"))
        o = torch.einsum("hij,jhd->ihd", torch.softmax(sc, dim=-1), kv[..., nope:]).reshape(S, H * V)
        return x + o @ w["wo"]

    def conv(self, z, wc):
        """Causal depthwise convolution within documents: out[t] = sum_i wc[i] z[t - K + 1 + i]."""
        S, K = z.shape[0], wc.shape[0]
        out = torch.zeros_like(z)
        for i in range(K):
            shift = K - 1 - i
            zs = torch.cat([torch.zeros(shift, z.shape[1], dtype=z.dtype), z[:S - shift]])
            same = torch.ones(S, dtype=torch.bool)
            same[shift:] = self.doc[shift:] == self.doc[:S - shift]
            same[:shift] = False
            out = out + wc[i] * zs * same[:, None].to(z.dtype)
        return out

    def gdn(self, x, w):
        """One Gated DeltaNet token mixer: x + y Wo."""
        c = self.cfg
        S = c["seq"]
        H = c["gdn_heads"] or c["heads"]
        Dk = c["gdn_head_dim_k"] or c["head_dim"]
        Dv = c["gdn_head_dim_v"] or c["head_dim"]
        silu = torch.nn.functional.silu
        h = self.rms(x, w["attn_norm"])
        q = silu(self.conv(h @ w["wq"], w["conv_q"])).reshape(S, H, Dk)
        k = silu(self.conv(h @ w["wk"], w["conv_k"])).reshape(S, H, Dk)
        v = silu(self.conv(h @ w["wv"], w["conv_v"])).reshape(S, H, Dv)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(h @ w["wb"])
        g = -torch.exp(w["a_log"].reshape(-1)) * torch.nn.functional.softplus(h @ w["wa"] + w["dt_bias"].reshape(-1))
        state = torch.zeros(H, Dv, Dk, dtype=x.dtype)
        outs = []
        for t in range(S):
            if t > 0 and self.doc[t] != self.doc[t - 1]:
                state = torch.zeros(H, Dv, Dk, dtype=x.dtype)
            a = torch.exp(g[t])[:, None]
            u = v[t] - a * torch.einsum("hvk,hk->hv", state, k[t])
            state = a[:, :, None] * state + beta[t][:, None, None] * torch.einsum("hv,hk->hvk", u, k[t])
            outs.append(torch.einsum("hvk,hk->hv", state, q[t]) / math.sqrt(Dk))
        o = torch.stack(outs)  # [S, H, Dv]
        on = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + c["norm_eps"]) * w["o_norm"].reshape(-1)
        y = (on * silu(h @ w["wg"]).reshape(S, H, Dv)).reshape(S, H * Dv)
        return x + y @ w["wo"]

    def forward(self):
        c, p = self.cfg, self.p
        S, H, Hkv, D = c["seq"], c["heads"], c["kv_heads"], c["head_dim"]
        x = p["emb"][self.tokens]
        for l, kind in enumerate(layer_kinds(c)):
            if kind == "D":
                w = {t: p[f"layers.{l}.{t}"] for t in GDN_TENSORS}
                x = self.gdn(x, w)
                h2 = self.rms(x, w["mlp_norm"])
                g, u = h2 @ w["w1"], h2 @ w["w3"]
                x = x + (torch.nn.functional.silu(g) * u) @ w["w2"]
                continue
            if attention_kind(c) == "mla":
                w = {t: p[f"layers.{l}.{t}"] for t in layer_tensors(c, kind)}
                x = self.mla(x, w, self.local_mask if kind == "L" else self.mask)
                h2 = self.rms(x, w["mlp_norm"])
                g, u = h2 @ w["w1"], h2 @ w["w3"]
                x = x + (torch.nn.functional.silu(g) * u) @ w["w2"]
                continue
            w = {t: p[f"layers.{l}.{t}"] for t in LAYER_TENSORS}
            h = self.rms(x, w["attn_norm"])
            q = self.r(self.rope(self.mm(h, w["wq"]).reshape(S, H, D)))
            k = self.r(self.rope(self.mm(h, w["wk"]).reshape(S, Hkv, D)))
            v = self.r(self.mm(h, w["wv"]).reshape(S, Hkv, D))
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            sc = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
            sc = sc.masked_fill(~(self.local_mask if kind == "L" else self.mask)[None], float("-inf"))
            if self.bf16_inputs:  # as the GPU kernels: exp(s - max) rounded to bf16 before P V, its sum not
                pu = torch.exp(sc - sc.amax(dim=-1, keepdim=True))
                o = (torch.einsum("hij,jhd->ihd", self.r(pu), v) / pu.sum(-1).transpose(0, 1)[..., None]).reshape(S, H * D)
            else:
                o = torch.einsum("hij,jhd->ihd", torch.softmax(sc, dim=-1), v).reshape(S, H * D)
            x = x + self.mm(o, w["wo"])
            h2 = self.rms(x, w["mlp_norm"])
            g, u = self.mm(h2, w["w1"]), self.mm(h2, w["w3"])
            x = x + self.mm(torch.nn.functional.silu(g) * u, w["w2"])
        logits = self.mm(self.rms(x, p["final_norm"]), p["lm_head"])
        loss = torch.nn.functional.cross_entropy(logits, self.labels, ignore_index=-1, reduction="mean")
        return loss, logits


def adamw_step(cfg, names, params, m, v, grads, step, dtype):
    """One AdamW update as torch.optim.AdamW with torch.nn.utils.clip_grad_norm_ (decoupled weight
    decay on matrices only, NO_DECAY by name), every operation in `dtype` (np.float64: the
    reference; np.float32: the naive fp32 implementation). `step` counts from 1. Returns the new
    params, m and v (dicts of arrays of `dtype`)."""
    t = lambda x: np.asarray(x, dtype=dtype)
    lr, b1, b2, eps, wd = (t(cfg[k]) for k in ("lr", "beta1", "beta2", "adam_eps", "weight_decay"))
    g = {n: t(grads[n]) for n in names}
    one = t(1)
    scale = one
    if cfg["grad_clip"] > 0:
        norm = np.sqrt(sum(np.sum(g[n] * g[n], dtype=dtype) for n in names), dtype=dtype)
        if norm > cfg["grad_clip"]:
            scale = t(cfg["grad_clip"]) / (norm + t(1e-6))
    bc1 = one - b1 ** t(step)
    bc2_sqrt = np.sqrt(one - b2 ** t(step))
    out_p, out_m, out_v = {}, {}, {}
    for n in names:
        gi = scale * g[n]
        mi = b1 * t(m[n]) + (one - b1) * gi
        vi = b2 * t(v[n]) + (one - b2) * gi * gi
        decay = one if n.endswith(NO_DECAY) else one - lr * wd
        out_p[n] = t(params[n]) * decay - (lr / bc1) * mi / (np.sqrt(vi) / bc2_sqrt + eps)
        out_m[n], out_v[n] = mi, vi
    return out_p, out_m, out_v
