"""fp64 numpy attention forward and backward (the definition of kernels/attn_params.hpp's
visibility rule: same document, causal / window by global position), shared by the `ctxpar attn`
end-to-end tests. Inputs q, do [S, H_q, D], k, v [S, H_kv, D] (GQA: H_q a multiple of H_kv),
doc [S] or None; returns o, lse [S, H_q], dq, dk, dv in the output file's layout."""
import numpy as np


def reference(q, k, v, do, doc, causal, window, rnd=None):
    """rnd (optional): a rounding applied to the probabilities P before P V and P^T dO and to dS
    before dS K and dS^T Q, as a bf16 flash kernel rounds its tensor-core operands."""
    S, Hq, D = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    pos = np.arange(S)
    vis = np.ones((S, S), bool)
    if causal:
        vis &= pos[:, None] >= pos[None, :]
    if window > 0:
        vis &= (pos[:, None] - pos[None, :]) < window
    if doc is not None:
        vis &= doc[:, None] == doc[None, :]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) / np.sqrt(D)
    s = np.where(vis[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    P = p / l
    r = rnd if rnd is not None else (lambda x: x)
    o = np.einsum("hij,jhd->ihd", r(P), vv)
    dP = np.einsum("ihd,jhd->hij", do, vv)
    Dd = np.einsum("ihd,ihd->hi", do, o)
    dS = r(P * (dP - Dd[..., None]) / np.sqrt(D))
    return {
        "o": o,
        "lse": (m + np.log(l))[..., 0].T,
        "dq": np.einsum("hij,jhd->ihd", dS, kk),
        "dk": np.einsum("hij,ihd->jhd", dS, q).reshape(S, Hkv, g, D).sum(2),
        "dv": np.einsum("hij,ihd->jhd", r(P), do).reshape(S, Hkv, g, D).sum(2),
    }


def max_rel_errors(out_path, in_path):
    """{tensor: (error relative to max(1, max|ref|), message or None)} of a `ctxpar attn` output
    against the reference on the inputs in `in_path` (the output file itself for generated
    inputs)."""
    import h5py
    with h5py.File(in_path, "r") as f:
        x = {n: f[n][...].astype(np.float64) for n in ("q", "k", "v", "do")}
        doc = f["doc_id"][...] if "doc_id" in f else None
        causal, window = int(f.attrs.get("causal", 1)), int(f.attrs.get("window", 0))
    r = reference(x["q"], x["k"], x["v"], x["do"], doc, causal, window)
    result = {}
    with h5py.File(out_path, "r") as f:
        for n, want in r.items():
            got = f[n][...]
            if got.shape != want.shape or got.dtype != np.float32:
                result[n] = (np.inf, f"{n} has shape {got.shape} {got.dtype}, expected {want.shape} float32")
                continue
            result[n] = (np.abs(got - want).max() / max(1.0, np.abs(want).max()), None)
    return result
