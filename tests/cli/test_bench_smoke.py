#!/usr/bin/env python3
"""Every `ctxpar bench` mode at a tiny size (bench attn excepted: its goal rows alone take minutes):
exit 0, a CSV whose header has the documented columns, every correctness column 0, and the
VALID line of the text table. Performance is not judged here (benchmarks are not timed tests).
Usage: test_bench_smoke.py CTXPAR_BINARY"""
import csv
import io
import os
import re
import subprocess
import sys
import tempfile

import h5py  # Debian's python3-h5py (CTXPAR_PYTHON is /usr/bin/python3)

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
tmp = tempfile.mkdtemp(prefix="ctxpar-bench-")
# Each bench's small settings: only keys it reads (a key a mode does not read is refused).
HEADS = ["heads=4", "kv_heads=2", "head_dim=32"]
SMALL_OF = {"comm": ["bench_iters=3", "warmup=1"], "cp": HEADS + ["warmup=1"], "train": HEADS + ["warmup=1"],
            "infer": HEADS + ["bench_iters=3", "warmup=1"], "peak": [], "calibrate": HEADS}
SMALL = SMALL_OF["cp"]
MODEL = ["layers=2", "dim=128", "ffn_dim=256", "vocab=256"]
failures = []
checks = 0


def expect(cond, what, text=""):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, "\n---\n" + text[-3000:] + "\n---")


def run(np, args, cwd=None):
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", sys.argv[1]] + args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=cwd)
    return p.returncode, p.stdout + p.stderr


def tables(text):
    """The CSV tables of a --csv run: a header line of identifiers, then the lines with as many
    fields (log lines around them, which may hold commas too, are not part of a table)."""
    header = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)+$")
    blocks, cur = [], None
    for line in text.splitlines():
        if header.match(line):
            cur = [line]
            blocks.append(cur)
        elif cur is not None and line.count(",") == cur[0].count(","):
            cur.append(line)
        else:
            cur = None
    return [list(csv.DictReader(io.StringIO("\n".join(b)))) for b in blocks]


CASES = [
    ("comm", 2, ["bench_max_bytes=64K"], ["op", "size_bytes", "busbw_gbs", "wrong"]),
    ("cp", 2, ["seq=1K"], ["strategy", "wrong"]),
    # attention and Gated DeltaNet tables (layer_pattern with G and D), both GDN schedules
    ("cp", 2, ["seq=512", "layer_pattern=DG", "gdn_heads=2", "gdn_head_dim_k=32", "gdn_head_dim_v=16"],
     ["strategy", "schedule", "bytes_kb", "bound_kb", "pct_sgemm", "wrong"]),
    ("train", 2, ["seq=512", "steps=2", "layer_pattern=DG"] + MODEL, ["step_ms", "mfu_pct", "wrong"]),
    ("train", 2, ["seq=512", "steps=2"] + MODEL, ["step_ms", "mfu_pct", "fma_gflops", "mfu_fma_pct", "wrong"]),
    # deterministic=true: a plain row and a deterministic one, their losses agreeing (#wrong 0)
    ("train", 2, ["seq=512", "steps=2", "deterministic=true"] + MODEL, ["schedule", "step_ms", "wrong"]),
    ("infer", 2, ["seq=512"] + MODEL, ["pass_kv_ms", "pass_q_ms", "wrong"]),
    ("infer", 2, ["seq=256", "mesh=tp:2"] + MODEL, ["pass_kv_ms", "pass_q_ms", "ttit_ms", "tok_s", "wrong"]),
    # deterministic=true: the exact schedule's table; a logit row whose bits differ from CP = 1's (#bits) counts
    # as wrong, so rc 0 and VALID mean bit-identical rows at CP 1 and 2
    ("infer", 2, ["seq=256", "deterministic=true"] + MODEL, ["prefill_det_ms", "ttit_det_ms", "bits", "wrong"]),
    # MLA's deterministic rows run the exact schedule on the expanded K/V
    ("cp", 2, ["seq=512", "deterministic=true", "attention=mla", "kv_lora_rank=32", "qk_nope_head_dim=16",
               "qk_rope_head_dim=8", "v_head_dim=16"], ["strategy", "wrong"]),
    ("peak", 1, [], ["sgemm_gflops", "fma_gflops", "fma_isa", "fma_bits", "wrong"]),
]
for mode, np, extra, cols in CASES:
    name = f"bench {mode}"
    rc, text = run(np, ["bench", mode] + SMALL_OF[mode] + extra + ["--csv", "out=" + os.path.join(tmp, mode + ".h5")])
    expect(rc == 0, f"{name} exits 0 (rc {rc})", text)
    ts = tables(text)
    expect(len(ts) > 0 and all(len(t) > 0 for t in ts), f"{name} prints non-empty CSV tables", text)
    header = set().union(*(t[0].keys() for t in ts if t)) if ts else set()
    for c in cols:
        expect(c in header, f"{name} CSV has column {c}", text)
    wrong = [r["wrong"] for t in ts for r in t if "wrong" in r]
    expect(len(wrong) > 0 and all(w == "0" for w in wrong), f"{name}: every #wrong is 0 ({wrong})", text)
    rc, text = run(np, ["bench", mode] + SMALL_OF[mode] + extra + ["out=" + os.path.join(tmp, mode + "-t.h5")])
    expect(rc == 0 and "VALID" in text and "INVALID" not in text, f"{name} text table ends VALID", text)

# A sliding window (local layers): a halo row first, moving fewer bytes than the ring beside it.
rc, text = run(2, ["bench", "cp"] + SMALL + ["seq=1K", "mask=window", "window=64", "--csv",
                                             "out=" + os.path.join(tmp, "cp-window.h5")])
rows = [r for t in tables(text) for r in t if "strategy" in r]
by = {r["strategy"]: r for r in rows if r.get("seq") == "1024"}
expect(rc == 0 and "halo" in by and "ring" in by, "bench cp mask=window has halo and ring rows at seq 1024", text)
if "halo" in by and "ring" in by:
    expect(float(by["halo"]["bytes_mb"]) < float(by["ring"]["bytes_mb"]) / 4,
           f"halo moves under a quarter of the ring's bytes ({by['halo']['bytes_mb']} vs {by['ring']['bytes_mb']} MB)")
    expect(by["halo"]["wrong"] == "0", "halo row: #wrong is 0", text)

# MLA: the latent ring beside the ring moving expanded K/V; its bytes are the latent's share,
# (kv_lora + rope) / (2 H (nope + rope)) = 40 / (2 * 4 * 24) here, plus the fp32 latent gradient
# against fp32 dK/dV in the backward (the same share): about 0.21 with the metadata.
rc, text = run(2, ["bench", "cp", "attention=mla", "heads=4", "kv_lora_rank=32", "qk_nope_head_dim=16",
                   "qk_rope_head_dim=8", "v_head_dim=16", "seq=2K", "strategy=all", "warmup=0",
                   "--csv", "out=" + os.path.join(tmp, "cp-mla.h5")])
rows = [r for t in tables(text) for r in t if "strategy" in r]
by = {r["strategy"]: r for r in rows if r.get("seq") == "2048"}
expect(rc == 0 and all(k in by for k in ("ring", "ring:kv", "allgather", "allgather:kv")),
       "bench cp attention=mla has ring, ring:kv, allgather, allgather:kv rows at seq 2048", text)
if "ring" in by and "ring:kv" in by:
    ratio = float(by["ring"]["bytes_mb"]) / float(by["ring:kv"]["bytes_mb"])
    expect(ratio < 0.3, f"the latent ring moves about 0.21 of the K/V ring's bytes (ratio {ratio:.3f})", text)
    expect(all(by[k]["wrong"] == "0" for k in ("ring", "ring:kv", "allgather", "allgather:kv")), "MLA rows: #wrong 0", text)
expect("ulysses" in by and by["ulysses"]["check"] == "skipped", "ulysses is skipped for MLA", text)

# bench train's MFU against the FMA loop: the rate over the peak it recorded, below 100 %.
rc, text = run(2, ["bench", "train"] + SMALL_OF["train"] + ["seq=512", "steps=2"] + MODEL + ["--csv", "out=" + os.path.join(tmp, "train-fma.h5")])
rows = [r for t in tables(text) for r in t if "mfu_fma_pct" in r]
with h5py.File(os.path.join(tmp, "train-fma.h5"), "r") as f:
    fma = float(f.attrs.get("fma_peak_flops_per_rank", 0))
expect(rc == 0 and len(rows) == 1 and fma > 0, f"bench train records the FMA peak ({fma}) and one row", text)
if rows and fma > 0:
    r = rows[0]
    want = 100 * float(r["tflops_per_rank"]) * 1e12 / fma
    expect(abs(float(r["fma_gflops"]) * 1e9 - fma) <= 0.051e9 and 0 < float(r["mfu_fma_pct"]) < 100 and
           abs(float(r["mfu_fma_pct"]) - want) <= 0.05 * want + 0.01,
           f"MFU/FMA {r['mfu_fma_pct']}% = TFLOP/s {r['tflops_per_rank']} over the recorded peak ({want:.2f}%)", text)

# The FMA-loop peak is recorded with its ISA and vector width (the widest this CPU has).
with h5py.File(os.path.join(tmp, "peak-t.h5"), "r") as f:
    a = f.attrs
    isa = a.get("fma_isa")
    isa = isa.decode() if isinstance(isa, bytes) else isa
    flags = open("/proc/cpuinfo").read().split()
    want = "avx512f" if "avx512f" in flags else "avx2+fma" if "avx2" in flags and "fma" in flags else "sse2 (mul+add)"
    expect(isa == want, f"trace fma_isa {isa!r} is the widest this CPU has ({want!r})")
    expect(int(a.get("fma_vector_bits", 0)) == {"avx512f": 512, "avx2+fma": 256}.get(want, 128),
           f"trace fma_vector_bits {a.get('fma_vector_bits')}")
    expect(float(a.get("fma_peak_flops_per_rank", 0)) > 0, "trace fma_peak_flops_per_rank > 0")

# bench calibrate writes the profile it is given, never the repository's inputs/hardware/local.toml.
prof = os.path.join(tmp, "local.toml")
rc, text = run(2, ["bench", "calibrate", "hardware=" + prof] + SMALL_OF["calibrate"] + ["out=" + os.path.join(tmp, "cal.h5")])
expect(rc == 0 and os.path.exists(prof), "bench calibrate writes hardware=FILE", text)
if os.path.exists(prof):
    body = open(prof).read()
    for key in ("intra_gb_s", "inter_gb_s", "measured_host", "measured_cpu", "measured_shapes"):
        expect(key in body, f"calibrated profile has {key}", body)
    # The profile says where it was measured: a plan for the calibrated shapes here gets no
    # warning; another model's shapes, or another host, get one naming the difference.
    model = ["predict", "out=" + os.path.join(tmp, "p.h5")]
    rc, text = run(1, model + ["hardware=" + prof] + HEADS)
    expect(rc == 0 and "warning" not in text, "predict with the profile calibrated here, same shapes: no warning", text)
    rc, text = run(1, model + ["hardware=" + prof, "heads=8", "kv_heads=2", "head_dim=32"])
    expect(rc == 0 and "warning: hardware profile local" in text and "shapes" in text and "H_q=4" in text,
           "predict for other shapes names the calibrated ones", text)
    other = os.path.join(tmp, "other.toml")
    with open(other, "w") as f:
        f.write(re.sub(r'measured_host = "[^"]*"', 'measured_host = "elsewhere-42"', body))
    rc, text = run(1, model + ["hardware=" + other] + HEADS)
    expect(rc == 0 and "host elsewhere-42 (here: " in text, "a profile from another host is named", text)
    # Where the calibrated profile lies (out/hardware/local.toml of the working directory), train
    # divides by its one-core FMA rate x threads, and says so.
    m = re.search(r"^core_fma_tflops = ([0-9.e+-]+)", body, re.M)
    expect(m is not None, "the calibrated profile records core_fma_tflops", body)
    here = os.path.join(tmp, "here")
    os.makedirs(os.path.join(here, "out", "hardware"))
    with open(os.path.join(here, "out", "hardware", "local.toml"), "w") as f:
        f.write(body)
    rc, text = run(2, ["train", "steps=1", "warmup=0", "seq=128"] + HEADS + MODEL, cwd=here)
    expect(rc == 0 and "FMA loop from bench calibrate (out/hardware/local.toml) x 1 thread" in text,
           "train takes its MFU peak from the calibrated profile", text)
    if rc == 0 and m:
        with h5py.File(os.path.join(here, "out", "train.h5")) as f:
            peak = float(f.attrs["peak_flops_per_rank"])
        expect(abs(peak / (float(m.group(1)) * 1e12) - 1) < 1e-5, f"trace peak {peak} = core_fma_tflops x 1 thread")
# The repository's example profile (no measured_host) gets a warning; a published one does not.
rc, text = run(1, ["predict", "out=" + os.path.join(tmp, "p.h5"), "hardware=" + os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs", "hardware", "local.toml")] + HEADS)
expect(rc == 0 and "the repository's example" in text, "the repository's example local profile is named as such", text)
rc, text = run(1, ["predict", "out=" + os.path.join(tmp, "p.h5"), "hardware=h100-gtt"] + HEADS)
expect(rc == 0 and "warning" not in text, "a published profile gets no warning", text)
print(f"{checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
