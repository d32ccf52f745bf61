#!/usr/bin/python3
"""`ctxpar attn device=cuda` end to end without a GPU: ctxpar_emu (the program with the CUDA kernels
emulated on the CUDA runtime test double, tests/gpu/CMakeLists.txt) runs each strategy on device
buffers at P = 1, 2, 3, 4 (bf16 inputs, device communicators), and the output file is held to the
bf16 policy against an fp64 numpy attention on the run's own inputs: max error at most 2x that of a
naive bf16 computation (fp32 numpy on the bf16-rounded inputs, with P and dS rounded to bf16 where
the kernels round them before their tensor-core products), plus a floor of 1e-6 x max(1, max|ref|)
(8x for dq and dk, whose single-key rows cancel; tolerance.hpp).
The file records the device, the trace the GPU memory high-water mark of every rank; a CPU run of
the same call must match within the same bound (and record no GPU memory). Then
`bench cp device=cuda strategy=all` at 2 ranks: every row present and its #wrong column 0; and
`run device=cuda` (usp on 2 x 2 ranks) VALID against the single-rank kernel; `bench infer device=cuda`
VALID with every table's rows. Last, bad input that
only a CUDA build reaches (train with D layers or the halo, more GPU memory than the GPU has, a
mode not built for the GPU, host offload of what is not built or outside train) refused with exit 2.

usage: test_attn_device.py CTXPAR_EMU CTXPAR MPIRUN WORKDIR [attn | modes]
  (two parts, two ctest tests that run side by side: attn, the attention calls through bench cp
  and run; modes, the spans of train and chat, bench infer and the bad input; default: both)
"""
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from attn_numpy import reference  # noqa: E402

EMU, CPU, MPIRUN, WORK = sys.argv[1:5]
PART = sys.argv[5] if len(sys.argv) > 5 else "all"
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
failures = []

CASES = [  # (P, S, strategy, mesh, H_q, H_kv, extra)
    (1, 128, "ring", "ring:1", 4, 2, []),
    (2, 256, "ring", "ring:2", 4, 2, []),
    (2, 256, "allgather", "ring:2", 4, 1, ["mask=window", "window=40"]),
    (2, 256, "ulysses", "ulysses:2", 4, 2, ["docs=random", "doc_mean=60"]),
    (3, 101, "ring", "ring:3", 2, 2, []),                       # padded: 101 splits into no 6 chunks
    (4, 256, "usp", "ulysses:2,ring:2", 4, 2, []),
    (4, 192, "ulysses", "ulysses:4", 4, 2, ["mask=window", "window=30"]),  # K/V heads replicated
    (4, 256, "allgather", "ring:4", 4, 4, ["docs=random", "doc_mean=50"]),
]


def bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def run(binary, P, out, args):
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(P), binary, "attn", *args, f"out={out}"]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        failures.append(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        return None
    return p.stdout


def attn_part():
    for P, S, strategy, mesh, Hq, Hkv, extra in CASES:
        label = f"P={P} S={S} {strategy} {mesh} {Hq}:{Hkv} {' '.join(extra)}"
        args = [f"seq={S}", f"heads={Hq}", f"kv_heads={Hkv}", "head_dim=32", f"strategy={strategy}", f"mesh={mesh}",
                "threads=1", *extra]
        out = os.path.join(WORK, f"dev_{P}_{S}_{strategy}_{len(extra)}.h5")
        cpu_out = out.replace("dev_", "cpu_")
        if run(EMU, P, out, ["device=cuda", *args]) is None or run(CPU, P, cpu_out, args) is None:
            continue
        with h5py.File(out, "r") as f:
            device = f.attrs.get("device", b"")
            device = device.decode() if isinstance(device, bytes) else str(device)
            if not device.startswith("cuda"):
                failures.append(f"{label}: the output file does not record device=cuda ({f.attrs.get('device')})")
            x = {n: f[n][...].astype(np.float64) for n in ("q", "k", "v", "do")}
            doc = f["doc_id"][...] if "doc_id" in f else None
            causal, window = int(f.attrs.get("causal", 1)), int(f.attrs.get("window", 0))
            got = {n: f[n][...].astype(np.float64) for n in ("o", "lse", "dq", "dk", "dv")}
        with h5py.File(cpu_out, "r") as f:
            cpu = {n: f[n][...].astype(np.float64) for n in ("o", "lse", "dq", "dk", "dv")}
        # The trace's GPU memory high-water mark: the device buffers of every rank; none on the CPU.
        for path, want_gpu in ((out, True), (cpu_out, False)):
            with h5py.File(path.replace(".h5", ".trace.h5"), "r") as f:
                peak = f["rank_steps"]["device_peak_bytes"]
                if want_gpu and not (len(peak) == P and peak.min() > 0):
                    failures.append(f"{label}: device_peak_bytes {list(peak)} (expected > 0 on each of {P} ranks)")
                if not want_gpu and peak.max() != 0:
                    failures.append(f"{label}: a CPU run records device_peak_bytes {list(peak)}")
        ref = reference(x["q"], x["k"], x["v"], x["do"], doc, causal, window)
        naive = reference(*(bf16(x[n]) for n in ("q", "k", "v", "do")), doc, causal, window, rnd=bf16)
        for n in ("o", "lse", "dq", "dk", "dv"):
            floor = (8.0 if n in ("dq", "dk") else 1.0) * 1e-6 * max(1.0, np.abs(ref[n]).max())
            tol = 2.0 * np.abs(naive[n].astype(np.float64) - ref[n]).max() + floor
            err = np.abs(got[n] - ref[n]).max()
            err_cpu = np.abs(cpu[n] - ref[n]).max()
            print(f"{label} {n}: device {err:.3g}, cpu {err_cpu:.3g}, bound {tol:.3g}")
            if not err <= tol:
                failures.append(f"{label} {n}: device error {err:.3g} > bound {tol:.3g}")
            if not err_cpu <= tol:
                failures.append(f"{label} {n}: cpu error {err_cpu:.3g} > bound {tol:.3g}")

    # bench cp device=cuda: every training strategy at 2 ranks, its correctness column against the CPU
    # kernel on the same bf16 inputs (bench_cp.cpp), and the device noted.
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", EMU, "bench", "cp", "device=cuda", "seq=256", "heads=4",
           "kv_heads=2", "head_dim=32", "strategy=all", "steps=1", "warmup=0", "threads=1", "docs=random", "doc_mean=70",
           "csv=true", "out=" + os.path.join(WORK, "bench_cp.h5")]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    rows = [l.split(",") for l in p.stdout.splitlines() if l and not l.startswith("#")]
    head = rows[0] if rows else []
    data = [r for r in rows[1:] if len(r) == len(head)]
    print(p.stdout[-3000:])
    if p.returncode != 0 or "wrong" not in head:
        failures.append(f"bench cp device=cuda: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    else:
        names = {r[head.index("strategy")] for r in data}
        if names != {"allgather", "ulysses", "ring", "usp"}:
            failures.append(f"bench cp device=cuda: rows for {sorted(names)}, expected the four training strategies")
        for r in data:
            if r[head.index("wrong")] != "0":
                failures.append(f"bench cp device=cuda: {r[0]} seq {r[1]}: {r[head.index('wrong')]} wrong elements")

    # `ctxpar run device=cuda` (the default job's attention steps on the GPU, usp on 2 x 2 ranks), its
    # check against the single-rank kernel on the same bf16 inputs.
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "4", EMU, "run", "device=cuda", "seq=256", "heads=4",
           "kv_heads=2", "head_dim=32", "strategy=usp", "mesh=ulysses:2,ring:2", "steps=1", "warmup=0", "threads=1",
           "out=" + os.path.join(WORK, "run.h5")]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    print(p.stdout[-1500:])
    if p.returncode != 0 or "# VALID" not in p.stdout or "device=cuda" not in p.stdout:
        failures.append(f"run device=cuda: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")


def modes_part():
    # Spans of a GPU run are timed by CUDA events on the compute stream (Tracer::time_on_device): two
    # training steps and one chat on 2 ranks; every span resolved (no mark left: a negative time)
    # and ordered (end >= begin); the GEMM spans (the model's bf16 GEMMs,
    # timed by their events) carry time, and the summary's GEMM share is theirs (not 0).
    TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs", "tiny.toml")
    # The chat also measures cp_algo=auto's profile on the device (hardware=measured, the default): the
    # bf16 GPU attention rate and the device links, transfers overlapping the kernels.
    for mode in (["train", "seq=64", "steps=2", "warmup=0"], ["chat", "docs=none", "schedule=prefill:48,decode:2"]):
        out = os.path.join(WORK, f"spans_{mode[0]}.h5")
        cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", EMU, *mode, "--config", TINY, "device=cuda",
               f"out={out}"]
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            failures.append(f"{mode[0]} device=cuda: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
            continue
        with h5py.File(out, "r") as f:
            sp = f["spans"][:]
        bad = (sp["t_begin_us"] < 0) | (sp["t_end_us"] < sp["t_begin_us"])
        gemm = sp["phase"] == 9  # Phase::gemm
        gemm_s = float((sp["t_end_us"][gemm] - sp["t_begin_us"][gemm]).sum()) * 1e-6
        print(f"{mode[0]} device=cuda: {len(sp)} spans, {int(bad.sum())} unresolved or reversed, GEMM spans {gemm_s:.3f} s")
        if len(sp) == 0 or bad.any() or gemm_s <= 0:
            failures.append(f"{mode[0]} device=cuda spans: {len(sp)} spans, {int(bad.sum())} bad, GEMM {gemm_s} s")
        if mode[0] == "chat":
            line = [l for l in p.stdout.splitlines() if "cp_algo cost model" in l]
            if not line or "bf16 GPU attention" not in line[0] or "overlapping the kernels" not in line[0]:
                failures.append(f"chat device=cuda: the cost model's profile is not the GPU's measured one: {line}")
        if mode[0] == "train":
            line = [l for l in p.stdout.splitlines() if "time in GEMMs" in l]
            if not line or " 0.0 %" in line[0].split("(")[0]:
                failures.append(f"train device=cuda: GEMM share missing or 0: {line}")

    # `bench infer device=cuda` (every table on the GPU: pass-KV vs pass-Q over miss rates, decode at CP
    # 1 and 2 with teacher forcing against CP 1, batched prefill, TTFT vs length) on 2 ranks: VALID,
    # every row's #wrong 0, and the decode table's attention time from the device spans (not 0).
    out = os.path.join(WORK, "bench_infer.h5")
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", EMU, "bench", "infer", "--config", TINY, "docs=none",
           "device=cuda", "seq=32", "bench_iters=1", "hardware=h200", f"out={out}"]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    rows = [l.split() for l in p.stdout.splitlines() if l.strip() and not l.startswith("#")]
    decode = [r for r in rows if len(r) == 8 and r[2] in ("pass_q", "allgather")]
    print(f"bench infer device=cuda: exit {p.returncode}, {len(rows)} rows, decode rows {decode}")
    if (p.returncode != 0 or "# VALID: bench infer" not in p.stdout or len(rows) != 7 + 4 + 4 + 4 or
            any(r[-1] != "0" for r in rows) or len(decode) != 4 or any(float(r[4]) <= 0 for r in decode)):
        failures.append(f"bench infer device=cuda: exit {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-2000:]}")

    # Bad input with device=cuda that only a CUDA build reaches: refused on every rank with exit 2, one
    # message naming the value, and no output file written.
    BAD = [  # (arguments, text the message must contain)
        (["train", "layer_pattern=DG"], "layer_pattern = 'DG'"),
        (["train", "seq=64M"], "of GPU memory per rank"),
        (["bench", "train", "seq=64M"], "of GPU memory per rank"),
        (["chat", "docs=none", "schedule=prefill:64M,decode:2"], "smaller batch"),
        (["bench", "comm"], "device = 'cuda' is built for"),
        (["bench", "infer", "docs=none", "seq=64M"], "a shorter seq or a smaller batch"),
        (["chat", "layer_pattern=DG", "docs=none"], "layer_pattern = 'DG'"),
        (["train", "offload=params"], "needs optimizer too"),
        (["train", "offload=optimizer,attn_out", "remat=full"], "nothing to offload"),
        (["train", "offload=optimizer,weights"], "not something to offload"),
        (["chat", "docs=none", "offload=optimizer"], "applies to train"),
    ]
    # Every rank exits with 2 by itself; mpirun need not wait its default second (the SIGTERM to SIGKILL
    # grace, odls_base_sigkill_timeout) for ranks that have already gone.
    bad_env = dict(ENV, OMPI_MCA_odls_base_sigkill_timeout="0")
    for args, text in BAD:
        out = os.path.join(WORK, "bad.h5")
        if os.path.exists(out):
            os.remove(out)
        cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", EMU, *args, "--config", TINY,
               "device=cuda", f"out={out}"]
        p = subprocess.run(cmd, env=bad_env, capture_output=True, text=True, timeout=120)
        msgs = [l for l in p.stderr.splitlines() if l.startswith("ctxpar: error:")]
        if p.returncode != 2 or len(msgs) != 1 or text not in msgs[0] or os.path.exists(out):
            failures.append(f"bad input {' '.join(args)}: exit {p.returncode}, messages {msgs}, file {os.path.exists(out)}")
        else:
            print(f"bad input {' '.join(args)}: exit 2: {msgs[0]}")


if PART in ("all", "attn"):
    attn_part()
if PART in ("all", "modes"):
    modes_part()
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
