#!/usr/bin/python3
"""`ctxpar chat | prefill | decode` end to end on 1 and 2 ranks: the trace holds what the issue
asks for — /steps rows with turn, TTFT (prefills) and TTIT (decode steps); /generated
[turn, step, batch] greedy token ids; /infer/calls one row per prefill with the choice and both
predicted costs; /infer/cache_bytes [step, rank] (balanced over ranks) — and the generated tokens
do not depend on the number of ranks or on the prefill / decode algorithm (the numerical checks
against a single-rank recompute are in test_infer); the --dry-run memory plan is at least the
run's tracked peak; with deterministic=true the tokens and every
saved logit have the same bits on 1 to 4 ranks, every algorithm, tp and local layers. (Bad input
to these modes: tests/cli/test_bad_input.py.)

usage: test_infer_cli.py CTXPAR MPIRUN WORKDIR [plain | deterministic]
"""
import os
import re
import subprocess
import sys

import h5py
import numpy as np

CTXPAR, MPIRUN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
MODEL = ["layers=2", "dim=64", "ffn_dim=128", "vocab=101", "heads=4", "kv_heads=2", "head_dim=16", "threads=1"]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(np_, mode, *args):
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np_), CTXPAR, mode, *MODEL, *args]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def planned_bytes(np_, mode, *args):
    """The --dry-run's memory estimate per rank, in bytes (None when the line is missing)."""
    rc, log = run(np_, mode, *args, "--dry-run")
    m = re.search(r"memory estimate per rank: ([0-9.]+) (B|KiB|MiB|GiB)", log)
    return float(m.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)] if rc == 0 and m else None


def check_plan(np_, mode, out, *args):
    """The memory plan is an upper bound of the run's tracked peak (the trace's peak_bytes, max over
    ranks and steps): the plan the start-up check admits a run by."""
    plan = planned_bytes(np_, mode, *args)
    with h5py.File(out) as f:
        peak = float(np.max(f["steps"]["peak_bytes"]))
    print(f"{mode} np={np_} {' '.join(args)}: plan {plan} B, measured peak {peak:.0f} B")
    check(plan is not None and plan >= peak, f"{mode} np={np_}: the plan {plan} B is below the measured peak {peak:.0f} B")


SCHED = "schedule=prefill:128,decode:5,prefill:32,decode:3"
def plain_runs():
    """Every prefill and decode algorithm, tp and dp: the trace's contents and the tokens."""
    gens = {}
    for np_, algo, dec in [(1, "auto", "pass_q"), (2, "pass_kv", "pass_q"), (2, "pass_q", "allgather"), (2, "auto", "pass_q")]:
        out = os.path.join(WORK, f"chat_{np_}_{algo}_{dec}.h5")
        rc, log = run(np_, "chat", SCHED, "batch=3", f"cp_algo={algo}", f"decode_algo={dec}", f"out={out}")
        check(rc == 0 and "VALID" in log, f"chat np={np_} {algo}/{dec}: rc {rc}\n{log[-2000:]}")
        if rc != 0:
            continue
        check_plan(np_, "chat", out, SCHED, "batch=3", f"cp_algo={algo}", f"decode_algo={dec}")
        with h5py.File(out) as f:
            g = f["generated"][:]
            gens[(np_, algo, dec)] = g
            check(g.shape == (2, 6, 3), f"/generated shape {g.shape}, want (turns 2, steps 1 + 5, batch 3)")
            check(((g[0] >= 0) & (g[0] < 101)).all(), "turn 0 tokens in range")
            check((g[1, :4] >= 0).all() and (g[1, 4:] == -1).all(), "turn 1: 1 + 3 tokens, then -1 padding")
            st = f["steps"][:]
            check(len(st) == 2 + 5 + 3, f"{len(st)} step rows, want 10")
            check(list(st["turn"]) == [0] * 6 + [1] * 4, f"turns {list(st['turn'])}")
            pre = [0, 6]
            for i in range(len(st)):
                if i in pre:
                    check(st["ttft_s"][i] > 0 and st["ttit_s"][i] == 0, f"step {i}: a prefill has TTFT only")
                else:
                    check(st["ttit_s"][i] > 0 and st["ttft_s"][i] == 0, f"step {i}: a decode step has TTIT only")
            check(list(st["tokens"]) == [3 * 128] + [3] * 5 + [3 * 32] + [3] * 3, f"tokens {list(st['tokens'])}")
            calls = f["infer/calls"][:]
            cols = f["infer/calls"].attrs["columns"]
            cols = (cols.decode() if isinstance(cols, bytes) else cols).split(",")
            check(calls.shape == (2, 11), f"/infer/calls shape {calls.shape}")
            lens = f["infer/call_lengths"][:]
            lcols = f["infer/call_lengths"].attrs["columns"]
            lcols = (lcols.decode() if isinstance(lcols, bytes) else lcols).split(",")
            check(lens.shape == (2, 3, 9) and (lens[:, :, 0] == [[128] * 3, [32] * 3]).all()
                  and (lens[:, :, 2] == calls[:, cols.index("algo(0=pass_kv;1=pass_q)")][:, None]).all()
                  and (lens[:, :, 1] == [[0] * 3, [133] * 3]).all(), f"/infer/call_lengths {lens.tolist()}")
            # Each sequence's TTFT: positive, at most the call's (a packed batch's sequences finish
            # together, within the call's closing exchange of the last logits).
            ttft_seq = lens[:, :, lcols.index("ttft_s")]
            ttft_call = calls[:, cols.index("ttft_s")]
            check((ttft_seq > 0).all() and (ttft_seq <= ttft_call[:, None] * 1.001 + 1e-4).all(),
                  f"per-sequence TTFT {ttft_seq.tolist()} within the call's {ttft_call.tolist()}")
            check(lcols[:3] == ["T", "P", "algo(0=pass_kv;1=pass_q)"] and "eq1_pass_kv" in lcols, f"columns {lcols}")
            check(list(calls[:, cols.index("T")]) == [128, 32] and list(calls[:, cols.index("P")]) == [0, 133],
                  f"calls T/P {calls[:, 1:3]}")
            ia = cols.index("algo(0=pass_kv;1=pass_q)")
            if algo != "auto":
                check((calls[:, ia] == (algo == "pass_q")).all(), f"forced {algo}: {calls[:, ia]}")
            else:
                check((calls[:, ia] == calls[:, cols.index("model_choice(1=pass_q)")]).all(), "auto follows the model")
            check((calls[:, cols.index("pred_pass_kv_s")] > 0).all() and (calls[:, cols.index("pred_pass_q_s")] > 0).all(),
                  "both predictions recorded")
            cb = f["infer/cache_bytes"][:]
            check(cb.shape == (10, np_), f"cache_bytes shape {cb.shape}")
            per_token = 3 * (2 * 2 * 2 * 16 * 4 + 8) / 3  # per sequence-token: 2 layers K+V, H_kv 2 x D 16 fp32 + pos
            check(abs(cb[-1].sum() - 3 * (128 + 5 + 32 + 3) * per_token) < 1e-6, f"total cache bytes {cb[-1].sum()}")
            check(cb[-1].max() - cb[-1].min() <= 3 * per_token, f"cache balanced over ranks: {cb[-1]}")
            check(f.attrs["status"] in ("complete", b"complete"), "status complete")
    # tensor parallel: heads and FFN over tp:2 (one CP rank), the same tokens as one rank.
    out = os.path.join(WORK, "chat_tp2.h5")
    rc, log = run(2, "chat", SCHED, "batch=3", "mesh=tp:2", f"out={out}")
    check(rc == 0 and "VALID" in log, f"chat mesh=tp:2: rc {rc}\n{log[-2000:]}")
    if rc == 0:
        with h5py.File(out) as f:
            gens[(2, "tp2", "pass_q")] = f["generated"][:]
    # dp: two replicas, each serving its own batch of 2 (sequences 2d + b), equal one rank serving all 4.
    lens = "schedule=prefill:37/20,decode:3,prefill:5/9,decode:2"
    outs = [os.path.join(WORK, f"chat_dp{n}.h5") for n in (1, 2)]
    rc1, log1 = run(1, "chat", "batch=4", "schedule=prefill:37/20/37/20,decode:3,prefill:5/9/5/9,decode:2", f"out={outs[0]}")
    rc2, log2 = run(2, "chat", "batch=2", "mesh=dp:2", lens, f"out={outs[1]}")
    check(rc1 == 0 and rc2 == 0, f"chat dp: rc {rc1} {rc2}\n{log1[-1000:]}\n{log2[-1500:]}")
    if rc1 == 0 and rc2 == 0:
        with h5py.File(outs[0]) as a, h5py.File(outs[1]) as b:
            check(np.array_equal(a["generated"][:], b["generated"][:]),
                  f"dp:2 x batch 2 tokens {b['generated'][:].ravel()} equal 1 rank x batch 4 {a['generated'][:].ravel()}")
            check(list(b["steps"]["tokens"]) == list(a["steps"]["tokens"]), f"dp tokens per step {list(b['steps']['tokens'])}")

    # placement=balanced (frugal): a long prompt and short ones placed from their lengths, decode and a
    # partial prefill over the cache as placed; the tokens of one rank, the cache holding every token.
    sched = "schedule=prefill:200/16/9/1/30/16,decode:4,prefill:5/9/1/2/3/4,decode:2"
    outs = [os.path.join(WORK, f"chat_placed{n}.h5") for n in (1, 2, 3)]
    for n, out in zip((1, 2, 3), outs):
        rc, log = run(n, "chat", "batch=6", sched, "cp_algo=pass_kv", "frugal=true", "placement=balanced", f"out={out}")
        check(rc == 0 and "VALID" in log and "# placement balanced" in log, f"chat placed np={n}: rc {rc}\n{log[-2000:]}")
        if rc == 0:
            check_plan(n, "chat", out, "batch=6", sched, "cp_algo=pass_kv", "frugal=true", "placement=balanced")
        if n > 1 and rc == 0:
            line = [l for l in log.splitlines() if l.startswith("# placement balanced")][0]
            spans = line.split("ranks per sequence ")[1].split(";")[0].split("/")
            # a prompt of several tokens (16, 9, 30, 16) kept whole on one rank
            check(len(spans) == 6 and "1" in [spans[i] for i in (1, 2, 4, 5)], f"np={n}: a short prompt whole: {line}")
            with h5py.File(out) as f, h5py.File(outs[0]) as a:
                check(np.array_equal(f["generated"][:], a["generated"][:]),
                      f"placed np={n} tokens {f['generated'][:].ravel()} equal one rank's {a['generated'][:].ravel()}")
                per_token = 2 * 2 * 2 * 16 * 4 + 8
                total = (200 + 16 + 9 + 1 + 30 + 16) + 6 * 4 + (5 + 9 + 1 + 2 + 3 + 4) + 6 * 2
                cb = f["infer/cache_bytes"][:]
                check(abs(cb[-1].sum() - total * per_token) < 1e-6, f"placed np={n}: cache bytes {cb[-1].sum()}")

    # The plan's engine alone (a profile, so no start-up measurement) on 4 ranks, a prefill then a
    # partial one over the cache, by either algorithm: pass-Q's partial outputs of every rank's
    # block grow with the ranks.
    for algo in ("pass_kv", "pass_q"):
        out = os.path.join(WORK, f"chat_plan_{algo}.h5")
        args = ("batch=2", "schedule=prefill:4K,decode:4,prefill:1K,decode:4", f"cp_algo={algo}", "hardware=h100-gtt")
        rc, log = run(4, "chat", *args, f"out={out}")
        check(rc == 0 and "VALID" in log, f"chat np=4 {algo}: rc {rc}\n{log[-2000:]}")
        if rc == 0:
            check_plan(4, "chat", out, *args)

    base = gens.get((1, "auto", "pass_q"))
    for k, g in gens.items():
        if base is not None:
            check(np.array_equal(g, base), f"generated tokens of {k} equal the 1-rank run's")

    # prefill mode: setup prefill of the cache (turn -1, no TTFT) then the measured partial prefill.
    out = os.path.join(WORK, "prefill.h5")
    rc, log = run(2, "prefill", "seq=512", "miss_rate=0.1", "cp_algo=pass_q", "warmup=0", "steps=2", f"out={out}")
    check(rc == 0, f"prefill rc {rc}\n{log[-2000:]}")
    if rc == 0:
        with h5py.File(out) as f:
            st = f["steps"][:]
            check(list(st["turn"]) == [-1, 0, -1, 1], f"prefill turns {list(st['turn'])}")
            check(list(st["tokens"]) == [461, 51, 461, 51], f"prefill tokens (P = 461, T = round(0.1 * 512) = 51): {list(st['tokens'])}")
            check((st["ttft_s"][[1, 3]] > 0).all() and (st["ttft_s"][[0, 2]] == 0).all(), "TTFT only on measured prefills")
            check(f["generated"].shape == (2, 1, 1), f"prefill /generated {f['generated'].shape}")

    # cp_algo=auto from a hardware profile of the cost model (hardware=h100-gtt): the choice and
    # both predicted TTFTs recorded per call, the profile named in the trace.
    out = os.path.join(WORK, "prefill_gtt.h5")
    rc, log = run(2, "prefill", "seq=512", "miss_rate=0.5", "hardware=h100-gtt", "warmup=0", "steps=1", f"out={out}")
    check(rc == 0 and "profile h100-gtt" in log, f"prefill hardware=h100-gtt rc {rc}\n{log[-2000:]}")
    if rc == 0:
        with h5py.File(out) as f:
            check(f.attrs["hw_profile"] == "h100-gtt", f"hw_profile attribute {f.attrs['hw_profile']}")
            calls = f["infer/calls"][:]
            cols = f["infer/calls"].attrs["columns"].split(",")
            kv, q = calls[0, cols.index("pred_pass_kv_s")], calls[0, cols.index("pred_pass_q_s")]
            chosen = calls[0, cols.index("algo(0=pass_kv;1=pass_q)")]
            check(kv > 0 and q > 0 and chosen == (1.0 if q < kv else 0.0), f"auto took the cheaper prediction ({kv}, {q}, {chosen})")

    # decode mode: full prefill then warmup + steps decode steps.
    out = os.path.join(WORK, "decode.h5")
    rc, log = run(2, "decode", "seq=256", "batch=4", "decode_algo=allgather", "warmup=1", "steps=4", f"out={out}")
    check(rc == 0 and "TTIT median" in log, f"decode rc {rc}\n{log[-2000:]}")
    if rc == 0:
        with h5py.File(out) as f:
            check(f["generated"].shape == (1, 6, 4), f"decode /generated {f['generated'].shape}")
            check((f["steps"]["ttit_s"][1:] > 0).all(), "decode TTIT recorded")


def deterministic_chats(tag, base, cases):
    """Runs `chat` with `base` plus each case's arguments; every deterministic run's generated tokens
    and saved logits must have the bits of the first case's (np 1); a case named plain_* (the plain
    schedule) must differ in its bits, which shows the comparison can fail, yet agree within 2e-5."""
    res = {}
    for name, np_, extra in cases:
        out = os.path.join(WORK, f"det_{tag}_{name}.h5")
        rc, log = run(np_, "chat", *base, *extra, f"out={out}")
        check(rc == 0 and "VALID" in log, f"deterministic {tag} chat {name}: rc {rc}\n{log[-2000:]}")
        if rc == 0:
            with h5py.File(out) as f:
                res[name] = (f["generated"][:], f["infer/logits"][:])
    first = cases[0][0]
    if first not in res:
        return
    g0, l0 = res[first]
    for name, (g, l) in res.items():
        same = l.shape == l0.shape and l.tobytes() == l0.tobytes()
        if name.startswith("plain"):
            err = np.max(np.abs(l - l0)) / max(1.0, np.max(np.abs(l0)))
            check(not same and err < 2e-5, f"{tag} {name}: logits differ in their bits but within 2e-5 (max rel {err:.2e})")
            continue
        check(np.array_equal(g, g0), f"deterministic {tag} {name}: generated tokens equal the 1-rank run's")
        check(same, f"deterministic {tag} {name}: logits bit-identical to the 1-rank run's ({np.sum(l != l0)} differ)")


def deterministic_runs():
    # deterministic=true: the generated tokens and every saved logit have the same bits on 1 to 4 ranks,
    # with every prefill and decode algorithm and full-prefill strategy, 1 or 2 threads, tp, and local
    # (L) layers; and agree with the plain schedule's logits within fp32 error.
    deterministic_chats("local", [SCHED, "batch=3", "save_logits=true", "deterministic=true", "layer_pattern=GL", "window=24"],
                        [("np1", 1, []), ("np2_passkv", 2, ["cp_algo=pass_kv", "decode_algo=pass_q"]),
                         ("np3_passq", 3, ["cp_algo=pass_q", "decode_algo=allgather"]),
                         ("np4_usp", 4, ["strategy=usp", "mesh=ulysses:2,ring:2", "cp_algo=pass_kv"]),
                         ("np2_ulysses", 2, ["strategy=ulysses", "mesh=ulysses:2", "cp_algo=pass_kv"]),
                         ("np2_threads2", 2, ["threads=2", "decode_algo=allgather"]),
                         ("tp2", 2, ["mesh=tp:2"]), ("tp2_ring2", 4, ["mesh=tp:2,ring:2", "cp_algo=pass_q"]),
                         ("plain_np1", 1, ["deterministic=false"])])
    # K/V heads replicated over tp (2 K/V heads on tp:4, 4 query heads): the tp sums in parts of one
    # query head (deterministic_heads), the same on every tp size
    deterministic_chats("kv_replicated", [SCHED, "batch=3", "save_logits=true", "deterministic=true", "deterministic_heads=1"],
                        [("np1", 1, []), ("tp4", 4, ["mesh=tp:4"]), ("tp2_ring2", 4, ["mesh=tp:2,ring:2", "cp_algo=pass_q"]),
                         ("tp4_threads2", 4, ["mesh=tp:4", "threads=2"]),
                         ("plain_tp4", 4, ["mesh=tp:4", "deterministic=false", "deterministic_heads=0"])])
    # MLA (the absorbed form: multi-query attention over the cached latent rows) by the exact schedule
    MLA = ["attention=mla", "q_lora_rank=16", "kv_lora_rank=16", "qk_nope_head_dim=16", "qk_rope_head_dim=8", "v_head_dim=16"]
    deterministic_chats("mla", MLA + [SCHED, "batch=3", "save_logits=true", "deterministic=true"],
                        [("np1", 1, []), ("np2_passkv", 2, ["cp_algo=pass_kv", "decode_algo=pass_q"]),
                         ("np3_passq", 3, ["cp_algo=pass_q", "decode_algo=allgather"]), ("np2_threads2", 2, ["threads=2"]),
                         ("tp2", 2, ["mesh=tp:2"]), ("tp2_ring2", 4, ["mesh=tp:2,ring:2", "cp_algo=pass_q"]),
                         ("plain_np2", 2, ["deterministic=false"])])
    # Gated DeltaNet layers: a prompt's recurrence runs as one call on every rank, so any prefill
    # length gives the same bits on every mesh (100 tokens, gdn_chunk 8: pieces of 50, 25, 17 and 13
    # rows on 1 to 4 ranks, none whole chunks; 96 tokens: whole chunks), with either GDN schedule, the
    # state kept on its home rank or replicated.
    for T in (100, 96):
        deterministic_chats(f"gdn{T}", ["batch=3", "save_logits=true", "deterministic=true", "layer_pattern=GD", "gdn_chunk=8",
                                        f"schedule=prefill:{T},decode:5,prefill:{T},decode:3"],
                            [("np1", 1, []), ("np2_passkv", 2, ["cp_algo=pass_kv"]),
                             ("np3_passq", 3, ["cp_algo=pass_q", "decode_algo=allgather"]),
                             ("np4_scan", 4, ["gdn_schedule=scan"]),
                             ("np2_replicated_threads2", 2, ["gdn_state=replicated", "threads=2"]),
                             ("plain_np2", 2, ["deterministic=false"])])


# Two parts, two ctest tests that can run side by side: "plain" and "deterministic" (default: both).
PART = sys.argv[4] if len(sys.argv) > 4 else "all"
if PART in ("all", "plain"):
    plain_runs()
if PART in ("all", "deterministic"):
    deterministic_runs()
print("FAILED" if failures else "PASSED", len(failures), "failures")
sys.exit(1 if failures else 0)
