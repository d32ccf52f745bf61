"""End-to-end checks of `ctxpar train` on several meshes (ctest; mpirun --oversubscribe).

  mesh      the losses of 5 steps agree for np 1, every strategy at np 2 and 4, and tp:2 x ring:2
  remat     none, attention and full recompute give bit-identical losses (same mesh, 1 thread)
  restart   checkpoint_every=3, then a resumed run: losses bit-identical to the uninterrupted run
  data      raw uint16 / uint32 token files and an HDF5 "tokens" dataset with the same tokens
            train identically; documents split at eos_id
  learn     the synthetic stream is learnable: the loss falls by > 1 nat in 30 steps
  memory    the --dry-run estimate is within 15% of the measured peak tracked bytes
  errors    a tp size that does not divide kv_heads is a usage error (exit 2) naming kv_heads
  shard     shard=optimizer, grads, params against shard=none on every mesh kind (optimizer, and every level
            under deterministic=true: the same bits); resumes across meshes and levels; the --dry-run plan
  checkpoint_io  the parallel writer's file bit-identical to the serial one on every mesh kind; a resume from
            it; a SIGKILL mid-write leaves the last complete checkpoint whole
  deterministic  deterministic=true: losses and checkpoints bit-identical at np 1, 2, 3, 4, 6 and 8,
            every strategy, threads 1 and 2, remat, dp, tp (2 and 4, alone and with ring or ulysses),
            local and Gated DeltaNet layers, and a resume from 2 ranks onto 4

Mesh tolerance: relative 2e-5 on each loss (about 150 fp32 ulps). The meshes differ only in
reduction order (CP merges of partial attention, all-reduce sums over 1, 2 or 4 ranks, tp
partial products); the oracle test bounds each against fp64 PyTorch at ~1e-7 relative after 5
AdamW steps, so 2e-5 leaves room for the spread without hiding a wrong shard (a mis-sharded
batch or a missing gradient term changes the loss in the 3rd digit).

usage: test_train_runs.py CTXPAR MPIRUN CONFIG CASE
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

CTXPAR, MPIRUN, CONFIG = sys.argv[1:4]
CASE = sys.argv[4]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
# peak_tflops_per_rank: MFU against a stated peak, so no run spends ~0.4 s measuring the sgemm peak
BASE = ["seq=128", "warmup=0", "peak_tflops_per_rank=1"]
REL_TOL = 2e-5


def run(tmp, name, np_, args, expect_rc=0, threads=1):
    out = os.path.join(tmp, name + ".h5")
    cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS", CTXPAR, "train",
           "--config", CONFIG, f"out={out}"] + BASE + args
    # an OpenMPI session directory of the run's own: runs go two at a time (tests/CMakeLists.txt
    # ctxpar_own_session_dirs says why)
    env = dict(ENV, OMP_NUM_THREADS=str(threads), OMPI_MCA_orte_tmpdir_base=os.path.join(tmp, name + ".ompi"))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != expect_rc:
        print(" ".join(cmd))
        print(r.stdout[-4000:], r.stderr[-4000:])
        raise SystemExit(f"FAIL: {name}: exit code {r.returncode}, expected {expect_rc}")
    if expect_rc != 0:
        return r
    with h5py.File(out, "r") as f:
        steps = f["steps"]
        return dict(steps=np.array(steps["step"]), loss=np.array(steps["loss"]), peak=np.array(steps["peak_bytes"]),
                    stdout=r.stdout)


def case_mesh(tmp):
    ref = run(tmp, "np1", 1, ["steps=5"])["loss"]
    print("np1 losses", ref)
    meshes = []
    for s in ["allgather", "ulysses", "ring"]:
        meshes += [(f"{s}_np2", 2, [f"strategy={s}", "mesh=ring:2" if s != "ulysses" else "mesh=ulysses:2"]),
                   (f"{s}_np4", 4, [f"strategy={s}", "mesh=ring:4" if s != "ulysses" else "mesh=ulysses:4"])]
    meshes += [("usp_np2", 2, ["strategy=usp", "mesh=ulysses:2"]), ("usp_np4", 4, ["strategy=usp", "mesh=ulysses:2,ring:2"]),
               ("tp2_ring2", 4, ["strategy=ring", "mesh=tp:2,ring:2"])]
    # Balanced placement (shard/placement.hpp): each batch's documents placed from their lengths,
    # the frugal exchange; np 3 pads 256 tokens to 258 rows.
    meshes += [(f"balanced_np{n}", n, ["strategy=ring", f"mesh=ring:{n}", "frugal=true", "placement=balanced"])
               for n in (2, 3, 4)]
    meshes += [("balanced_tp2_ring2", 4, ["strategy=allgather", "mesh=tp:2,ring:2", "frugal=true", "placement=balanced"])]
    # Every document zigzag over all ranks on its own (placement=document, the THD layout of
    # Transformer Engine and Megatron-LM).
    meshes += [(f"document_np{n}", n, ["strategy=ring", f"mesh=ring:{n}", "frugal=true", "placement=document"])
               for n in (3, 4)]
    # placement=auto: per batch the placement the cost model prices cheaper (either runs the
    # single rank's losses).
    meshes += [("auto_np3", 3, ["strategy=ring", "mesh=ring:3", "frugal=true", "placement=auto"]),
               ("auto_gather_np2", 2, ["strategy=allgather", "mesh=ring:2", "frugal=true", "placement=auto"])]
    bad = []
    for name, np_, args in meshes:
        r = run(tmp, name, np_, ["steps=5"] + args)
        loss = r["loss"]
        if "placement=auto" in args:  # the log says what auto chose
            m = re.search(r"placement auto: (\d+) of (\d+) batches", r["stdout"])
            print(name, m.group(0) if m else "no 'placement auto' line in the log")
            if not m or int(m.group(2)) != 5:
                bad.append(name + ": no count of its choices")
        rel = np.max(np.abs(loss - ref) / np.abs(ref))
        print(f"{name:12s} max rel diff {rel:.2e}", "ok" if rel <= REL_TOL else "FAIL")
        if not rel <= REL_TOL or len(loss) != 5:
            bad.append(name)
    return bad


def case_remat(tmp):
    losses = {r: run(tmp, "remat_" + r, 2, ["steps=3", f"remat={r}", "mesh=ring:2"])["loss"] for r in ["none", "attention", "full"]}
    print(losses)
    return [r for r in losses if not np.array_equal(losses[r], losses["none"])]


def case_restart(tmp):
    ck = os.path.join(tmp, "ck.h5")
    full = run(tmp, "full", 2, ["steps=6", "mesh=ring:2"])
    part = run(tmp, "part", 2, ["steps=3", "mesh=ring:2", "checkpoint_every=3", f"checkpoint={ck}"])
    if not os.path.exists(ck) or os.path.exists(ck + ".partial"):  # io/atomic_file: NAME.partial until complete
        return ["checkpoint file missing or temp file left"]
    res = run(tmp, "resumed", 2, ["steps=6", "mesh=ring:2", f"resume={ck}"])
    print("uninterrupted", full["loss"], "\nfirst part   ", part["loss"], "\nresumed      ", res["steps"], res["loss"])
    bad = []
    if not np.array_equal(part["loss"], full["loss"][:3]):
        bad.append("first part differs")
    if not (np.array_equal(res["steps"], [3, 4, 5]) and np.array_equal(res["loss"], full["loss"][3:])):
        bad.append("resumed losses are not bit-identical")
    # A checkpoint of another model shape is refused before anything runs.
    r = run(tmp, "bad_resume", 2, ["steps=6", "mesh=ring:2", f"resume={ck}", "dim=64"], expect_rc=2)
    if "dim" not in r.stderr:
        bad.append("mismatched resume message does not name dim")
    return bad


def checkpoint_arrays(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda k, o: out.__setitem__(k, np.array(o)) if isinstance(o, h5py.Dataset) else None)
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def case_deterministic(tmp):
    """deterministic=true: losses, the checkpoint (parameters, both AdamW moments) and step 0's dump (logits, every
    gradient; meshes without dp) bit-identical
    on every CP mesh (1, 2, 3, 4, 6, 8 ranks), strategy and thread count, and across a resume from 2 ranks onto 4; dp
    replicas likewise among themselves; tp:2 and tp:4 (alone, and with ring or ulysses) like one rank; a model with a
    local (L) layer likewise, and one with a Gated DeltaNet (D) layer; with exact parts of 2 and 1 query heads
    (deterministic_heads), K/V heads replicated over ulysses (4, 8) and tp (4, 8) ranks like one rank; MLA
    models (with and without the query latent, with a local layer) on 1 to 4 CP ranks, tp 2 and 4. seq = 200 pads on every mesh (128-row blocks)."""
    # 2 steps: the first update from zero moments, the second from the first's (every step after runs the same code)
    det = ["deterministic=true", "seq=200", "steps=2", "checkpoint_every=2"]

    def go(name, np_, args, threads=1):
        ck, dump = os.path.join(tmp, name + ".ck.h5"), os.path.join(tmp, name + ".dump.h5")
        with_dump = not any(a.startswith("mesh=dp") or a.startswith("resume=") for a in args)  # dump: dp 1, step 0
        r = run(tmp, name, np_, det + [f"checkpoint={ck}"] + ([f"dump_init={dump}", "dump_steps=1"] if with_dump else []) + args,
                threads=threads)
        arrays = checkpoint_arrays(ck)
        if with_dump:  # step 0's logits and every gradient, gathered whole
            arrays.update({"dump/" + k: v for k, v in checkpoint_arrays(dump).items()})
        return r["loss"], arrays

    def go_all(runs):
        """go() for every (name, np, args[, threads]) of `runs`, two jobs at a time (each one mostly
        start-up and waits: two fill the machine), the results in the runs' order."""
        with ThreadPoolExecutor(2) as ex:
            futs = [ex.submit(go, r[0], r[1], r[2], r[3] if len(r) > 3 else 1) for r in runs]
            return [(r[0], f.result()) for r, f in zip(runs, futs)]

    bad = []

    def compare(group):
        ref_name, (ref_loss, ref_ck) = group[0]
        for name, (loss, ck) in group[1:]:
            diff = [k for k in ref_ck if (k in ck or not k.startswith("dump/")) and
                    (k not in ck or not same_bits(ref_ck[k], ck[k]))]
            ok = same_bits(loss, ref_loss) and not diff
            print(f"{name:18s} vs {ref_name}: losses {'same bits' if same_bits(loss, ref_loss) else loss - ref_loss}, "
                  f"{len(diff)} of {len(ck)} checkpoint and dump datasets differ", "ok" if ok else "FAIL")
            if not ok:
                bad.append(name)

    cp_runs = [("np1", 1, [], 1), ("np1_threads2", 1, [], 2),
               ("ring_np2", 2, ["strategy=ring"], 1), ("allgather_np2", 2, ["strategy=allgather"], 2),
               ("ulysses_np2", 2, ["strategy=ulysses", "mesh=ulysses:2"], 1),
               ("ring_np3", 3, ["strategy=ring"], 1), ("allgather_np3_remat", 3, ["strategy=allgather", "remat=full"], 1),
               ("ring_np4_threads2", 4, ["strategy=ring"], 2), ("usp_np4", 4, ["strategy=usp", "mesh=ulysses:2,ring:2"], 1),
               ("allgather_np6", 6, ["strategy=allgather"], 1), ("usp_np6", 6, ["strategy=usp", "mesh=ulysses:2,ring:3"], 1),
               ("ring_np8", 8, ["strategy=ring"], 1),
               ("tp2", 2, ["mesh=tp:2"], 1), ("tp2_ring2", 4, ["mesh=tp:2,ring:2", "strategy=ring"], 2)]
    results = go_all(cp_runs)
    # resumed: 1 step on 2 ranks, then the last one on 4 ranks from its checkpoint
    ck2 = os.path.join(tmp, "first_half.ck.h5")
    run(tmp, "first_half", 2, ["deterministic=true", "seq=200", "steps=1", "checkpoint_every=1", f"checkpoint={ck2}"])
    ck4 = os.path.join(tmp, "resumed.ck.h5")
    res = run(tmp, "resumed", 4, det + [f"checkpoint={ck4}", f"resume={ck2}"])
    ref_loss = results[0][1][0]
    resumed_ok = np.array_equal(res["steps"], [1]) and same_bits(res["loss"], ref_loss[1:])
    print("resumed 2 -> 4 ranks: losses", "same bits" if resumed_ok else res["loss"] - ref_loss[1:])
    if not resumed_ok:
        bad.append("resumed losses")
    results.append(("resumed_2to4", (ref_loss, checkpoint_arrays(ck4))))  # its checkpoint at step 2
    compare(results)
    # data parallel: two sequences per step, on 1, 2 and 3 CP ranks each
    compare(go_all([("dp2", 2, ["mesh=dp:2"]), ("dp2_ring2", 4, ["mesh=dp:2,ring:2"]),
                    ("dp2_ring3", 6, ["mesh=dp:2,ring:3", "strategy=allgather"])]))
    # tensor parallelism with 4 K/V heads: tp:4, and tp:2 beside ring or ulysses
    compare(go_all([(n, np_, ["kv_heads=4"] + a) for n, np_, a in
                    [("kv4_np1", 1, []), ("kv4_tp4", 4, ["mesh=tp:4"]),
                     ("kv4_tp2_ring2", 4, ["mesh=tp:2,ring:2", "strategy=ring"]),
                     ("kv4_tp2_ulysses2", 4, ["mesh=tp:2,ulysses:2", "strategy=ulysses"])]]))
    # exact parts of 2 query heads (deterministic_heads): the 2 K/V heads replicated on 2 ranks each, over
    # ulysses:4 or tp:4, whose integer dK/dV sums add up to one rank's; the tp sums in 4 parts
    heads2 = ["deterministic_heads=2"]
    parts = go_all([(n, np_, heads2 + a, t) for n, np_, a, t in
             [("heads2_np1", 1, [], 1), ("heads2_ring_np2", 2, ["strategy=ring"], 2),
              ("heads2_ulysses_np4", 4, ["strategy=ulysses", "mesh=ulysses:4"], 1),
              ("heads2_usp_np8", 8, ["strategy=usp", "mesh=ulysses:4,ring:2"], 1),
              ("heads2_tp4", 4, ["mesh=tp:4"], 1), ("heads2_tp2", 2, ["mesh=tp:2"], 2),
              ("heads2_tp4_ring2", 8, ["mesh=tp:4,ring:2", "strategy=ring"], 1),
              ("heads2_tp2_ulysses2", 4, ["mesh=tp:2,ulysses:2", "strategy=ulysses"], 1)]])
    compare(parts)
    # one-head parts: tp:8 puts one query head on each rank, each K/V head on 4
    heads1 = ["deterministic_heads=1"]
    parts1 = go_all([(n, np_, heads1 + a) for n, np_, a in [("heads1_np1", 1, []), ("heads1_tp8", 8, ["mesh=tp:8"]),
                                                           ("heads1_ulysses_np8", 8, ["strategy=ulysses", "mesh=ulysses:8"])]])
    compare(parts1)
    # MLA (the exact schedule moves the expanded K/V; the expander's GEMMs fixed-row, Wkv_b's gradient
    # exact; the latent's gradient and the output projection summed over tp in fixed parts), with and
    # without the query latent, beside a local layer, on CP and tp meshes
    mla = ["attention=mla", "q_lora_rank=24", "kv_lora_rank=32", "qk_nope_head_dim=16", "qk_rope_head_dim=8",
           "v_head_dim=16"]
    compare(go_all([(n, np_, mla + a, t) for n, np_, a, t in
             [("mla_np1", 1, [], 1), ("mla_ring_np2_threads2", 2, ["strategy=ring"], 2),
              ("mla_allgather_np3", 3, ["strategy=allgather"], 1), ("mla_ring_np4", 4, ["strategy=ring"], 1),
              ("mla_tp2", 2, ["mesh=tp:2"], 1), ("mla_tp4", 4, ["mesh=tp:4"], 1),
              ("mla_tp2_ring2", 4, ["mesh=tp:2,ring:2", "strategy=ring"], 2)]]))
    mla_local = mla + ["q_lora_rank=0", "layer_pattern=LG", "window=24"]
    compare(go_all([(n, np_, mla_local + a) for n, np_, a in
             [("mla_local_np1", 1, []), ("mla_local_ring_np2", 2, ["strategy=ring"]),
              ("mla_local_allgather_np3", 3, ["strategy=allgather"]),
              ("mla_local_tp2_ring2", 4, ["mesh=tp:2,ring:2", "strategy=allgather"])]]))
    # local (L) layers: the main strategy's exact schedule with the window mask
    loc = ["layer_pattern=GL", "window=24"]
    compare(go_all([(n, np_, loc + a) for n, np_, a in
             [("local_np1", 1, []), ("local_ring_np2", 2, ["strategy=ring"]), ("local_allgather_np3", 3, ["strategy=allgather"]),
              ("local_usp_np4", 4, ["strategy=usp", "mesh=ulysses:2,ring:2"])]]))
    # Gated DeltaNet layers (packed documents): pieces of whole blocks cut the recurrence at the same chunk
    # borders on every mesh; 512 tokens in 128-row blocks put block borders inside pieces too
    gdn = ["layer_pattern=DG", "seq=512", "deterministic_block=128"]
    compare(go_all([(n, np_, gdn + a, t) for n, np_, a, t in
             [("gdn_np1", 1, [], 1), ("gdn_ring_np2_threads2", 2, ["strategy=ring"], 2),
              ("gdn_allgather_np3", 3, ["strategy=allgather"], 1), ("gdn_ring_np4", 4, ["strategy=ring"], 1),
              ("gdn_usp_np4", 4, ["strategy=usp", "mesh=ulysses:2,ring:2"], 1)]]))
    # blocks of 384 rows (one BLIS call per block; another layout, so compared among themselves)
    b384 = ["deterministic_block=384"]
    compare(go_all([(n, np_, b384 + a, t) for n, np_, a, t in [("block384_np1", 1, [], 1),
                                                                ("block384_ring_np2", 2, ["strategy=ring"], 2),
                                                                ("block384_allgather_np3", 3, ["strategy=allgather"], 1)]]))
    # not a different model: the plain schedule's losses agree within the mesh tolerance
    plain = run(tmp, "plain_np1", 1, ["seq=200", "steps=2"])["loss"]
    rel = np.max(np.abs(plain - ref_loss) / np.abs(plain))
    print(f"deterministic vs plain (np 1): max rel diff {rel:.2e}", "ok" if rel <= REL_TOL else "FAIL")
    if not rel <= REL_TOL:
        bad.append("deterministic losses far from the plain schedule's")
    for name, (loss, _) in [parts[0], parts1[0]]:  # the same model in other exact parts
        rel = np.max(np.abs(plain - loss) / np.abs(plain))
        print(f"{name} vs plain (np 1): max rel diff {rel:.2e}", "ok" if rel <= REL_TOL else "FAIL")
        if not rel <= REL_TOL:
            bad.append(f"{name} losses far from the plain schedule's")
    return bad


def case_shard(tmp):
    """shard= (model/state_shard.hpp: each rank of dp x CP keeps the AdamW moments and master weights of its
    pieces of every unit; grads also reduce-scatters each unit's gradient; params also gathers each unit's
    weights before use). optimizer: the update is elementwise and the all-gather moves bits, so on one mesh
    the losses and the checkpoint (parameters, both moments) have the bits of shard=none with the plain
    numerics; grads and params sum the gradients by reduce-scatter (another order): losses within the mesh
    tolerance. Kinds: the ring at np 2 and at np 3 (units 3 does not divide: the last pieces shorter), usp over
    ulysses:2 x ring:2, tp:2 x ring:2, dp:2 x ring:2, an MLA model, a Gated DeltaNet one, ulysses with
    remat=full (the backward's recompute reads the gathered weights again), and tp:2 x ring:2 over one K/V
    head (its gradient summed over its two copies on the pieces). Under
    deterministic=true every level has the bits of none (losses and checkpoints) on ring, usp, tp:2 x ring:2
    and dp:2 x ring:2. A checkpoint written at shard=params on 4 ranks resumes at shard=none on 1 and on 2
    ranks, and one written at shard=none on 1 rank resumes at shard=params on 3, each with the uninterrupted
    one-rank run's losses bit for bit (deterministic). The --dry-run plan of each level within 15% of the
    measured peak, and each level's saving against none within 25% of the measured one."""
    bad = []
    levels = ("none", "optimizer", "grads", "params")

    def go(name, np_, args):
        ck = os.path.join(tmp, name + ".ck.h5")
        r = run(tmp, name, np_, ["steps=3", "checkpoint_every=3", f"checkpoint={ck}"] + args)
        return r["loss"], checkpoint_arrays(ck)

    def sweep(kinds, extra):
        runs = [(name + "_" + level, np_, args + extra + [f"shard={level}"]) for name, np_, args in kinds for level in levels]
        with ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda r: go(*r), runs))
        return {(kinds[i // len(levels)][0], levels[i % len(levels)]): g for i, g in enumerate(got)}

    def check(name, level, ref, got, bitwise):
        (loss0, ck0), (loss1, ck1) = ref, got
        diff = [k for k in ck0 if k not in ck1 or not same_bits(ck0[k], ck1[k])]
        rel = np.max(np.abs(loss1 - loss0) / np.abs(loss0))
        ok = len(loss1) == 3 and len(ck0) == len(ck1) and (same_bits(loss0, loss1) and not diff if bitwise else rel <= REL_TOL)
        print(f"{name:18s} shard={level:9s} vs none: losses {'same bits' if same_bits(loss0, loss1) else f'max rel diff {rel:.1e}'}, "
              f"{len(diff)} of {len(ck0)} checkpoint datasets differ", "ok" if ok else "FAIL")
        if not ok:
            bad.append(f"{name} shard={level}")

    mla = ["attention=mla", "q_lora_rank=24", "kv_lora_rank=32", "qk_nope_head_dim=16", "qk_rope_head_dim=8",
           "v_head_dim=16"]
    kinds = [("ring_np2", 2, ["strategy=ring"]), ("ring_np3", 3, ["strategy=ring", "seq=130"]),
             ("usp_np4", 4, ["strategy=usp", "mesh=ulysses:2,ring:2"]),
             ("tp2_ring2", 4, ["strategy=ring", "mesh=tp:2,ring:2"]), ("dp2_ring2", 4, ["strategy=ring", "mesh=dp:2,ring:2"]),
             ("mla_ring_np2", 2, ["strategy=ring"] + mla),
             ("gdn_allgather_np2", 2, ["strategy=allgather", "layer_pattern=DG"]),
             ("ulysses_np2_remat", 2, ["strategy=ulysses", "mesh=ulysses:2", "remat=full"]),
             ("tp2_ring2_kv_copies", 4, ["strategy=ring", "mesh=tp:2,ring:2", "kv_heads=1"])]
    got = sweep(kinds, [])
    for name, _, _ in kinds:
        for level in levels[1:]:
            check(name, level, got[(name, "none")], got[(name, level)], bitwise=level == "optimizer")
    det = ["deterministic=true", "seq=200"]
    got = sweep([k for k in kinds if k[0] in ("ring_np2", "usp_np4", "tp2_ring2", "dp2_ring2")], det)
    for (name, level), g in got.items():
        if level != "none":
            check("det_" + name, level, got[(name, "none")], g, bitwise=True)

    # across meshes and levels: deterministic=true, 4 steps, checkpoints after 2
    ref = run(tmp, "det_np1", 1, det + ["steps=4"])["loss"]
    for name, np_, args, resumes in [
            ("det_params_np4", 4, ["mesh=ring:4", "shard=params"], [("np1_none", 1, []), ("np2_none", 2, ["mesh=ring:2"])]),
            ("det_none_np1", 1, [], [("np3_params", 3, ["mesh=ring:3", "shard=params"])])]:
        ck = os.path.join(tmp, name + ".ck.h5")
        run(tmp, name, np_, det + args + ["steps=2", "checkpoint_every=2", f"checkpoint={ck}"])
        for rname, rnp, rargs in resumes:
            r = run(tmp, name + "_to_" + rname, rnp, det + rargs + ["steps=4", f"resume={ck}"])
            ok = np.array_equal(r["steps"], [2, 3]) and same_bits(r["loss"], ref[2:])
            print(f"{name} resumed on {rname}: losses", "same bits as np1" if ok else r["loss"] - ref[2:], "ok" if ok else "FAIL")
            if not ok:
                bad.append(f"{name} resumed on {rname}")

    # the plan: the state per rank at each level against the measured peaks
    mem = ["steps=1", "mesh=ring:4", "seq=512", "dim=512", "ffn_dim=2048", "vocab=8000"]
    est, peak = {}, {}
    for level in levels:
        est[level] = dry_run_estimate(4, mem + [f"shard={level}"])
        if est[level] is None:
            return bad + [f"no memory estimate in --dry-run (shard={level})"]
        peak[level] = run(tmp, "mem_shard_" + level, 4, mem + [f"shard={level}"])["peak"].max()
        print(f"shard={level}: plan {est[level] / 2**20:.2f} MiB, measured peak {peak[level] / 2**20:.2f} MiB")
        if abs(peak[level] - est[level]) > 0.15 * peak[level]:
            bad.append(f"shard={level} plan off by more than 15%")
    for level in levels[1:]:
        d_est, d_peak = est["none"] - est[level], peak["none"] - peak[level]
        print(f"none - {level}: plan {d_est / 2**20:.2f} MiB, measured {d_peak / 2**20:.2f} MiB")
        if not (d_peak > 0 and abs(d_est - d_peak) <= 0.25 * d_peak):
            bad.append(f"none - {level}: plan {d_est / 2**20:.2f} MiB vs measured {d_peak / 2**20:.2f} MiB (> 25% apart)")
    return bad


def case_checkpoint_io(tmp):
    """checkpoint_io=parallel (every rank writes its part of each tensor at once through MPI-IO) writes the
    file the serial writer (rank 0 after a gather) writes, dataset for dataset bit for bit: on ring:4 with the
    state whole (the write split over the ranks anyway), ring:3 at shard=optimizer (pieces that 3 does not
    divide), tp:2 x ring:2 at shard=params, dp:2 x ring:2 at shard=grads, K/V heads copied over tp:4 (each
    head's first copy writes it), MLA on tp:2 (latents every tp rank holds alike); a run resumed from a
    parallel checkpoint written at shard=params on 4 ranks has the uninterrupted run's losses bit for bit
    (deterministic) on 1 rank. A SIGKILL while a parallel checkpoint is being written leaves the last complete
    one whole and resumable."""
    bad = []
    mla = ["attention=mla", "q_lora_rank=24", "kv_lora_rank=32", "qk_nope_head_dim=16", "qk_rope_head_dim=8",
           "v_head_dim=16", "mesh=tp:2"]
    kinds = [("ring_np4", 4, ["mesh=ring:4"]), ("ring_np3_optimizer", 3, ["mesh=ring:3", "shard=optimizer", "seq=130"]),
             ("tp2_ring2_params", 4, ["mesh=tp:2,ring:2", "shard=params"]),
             ("dp2_ring2_grads", 4, ["mesh=dp:2,ring:2", "shard=grads"]),
             ("tp4_kv_copies", 4, ["mesh=tp:4", "shard=optimizer"]), ("mla_tp2", 2, mla)]

    def go(name, np_, args, io):
        ck = os.path.join(tmp, f"{name}_{io}.ck.h5")
        run(tmp, f"{name}_{io}", np_, ["steps=2", "checkpoint_every=2", f"checkpoint={ck}", f"checkpoint_io={io}"] + args)
        with h5py.File(ck, "r") as f:
            step = int(f.attrs["step"])
        return step, checkpoint_arrays(ck)

    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda r: go(*r), [(n, np_, a, io) for n, np_, a in kinds for io in ("serial", "parallel")]))
    for i, (name, _, _) in enumerate(kinds):
        (s0, a0), (s1, a1) = got[2 * i], got[2 * i + 1]
        diff = [k for k in a0 if k not in a1 or not same_bits(a0[k], a1[k])]
        ok = s0 == s1 == 2 and not diff and len(a0) == len(a1) and len(a0) > 0
        print(f"{name:18s} parallel vs serial writer: {len(diff)} of {len(a0)} datasets differ", "ok" if ok else "FAIL")
        if not ok:
            bad.append(name)

    det = ["deterministic=true", "seq=200"]
    ref = run(tmp, "io_det_np1", 1, det + ["steps=4"])["loss"]
    ck = os.path.join(tmp, "io_det_params.ck.h5")
    run(tmp, "io_det_params", 4, det + ["mesh=ring:4", "shard=params", "checkpoint_io=parallel", "steps=2",
                                        "checkpoint_every=2", f"checkpoint={ck}"])
    r = run(tmp, "io_det_resumed", 1, det + ["steps=4", f"resume={ck}"])
    ok = np.array_equal(r["steps"], [2, 3]) and same_bits(r["loss"], ref[2:])
    print("parallel checkpoint (shard=params, 4 ranks) resumed on 1 rank:", "same bits" if ok else r["loss"] - ref[2:])
    if not ok:
        bad.append("resume from a parallel checkpoint")

    # SIGKILL while a parallel checkpoint is written: the last complete one stays whole and resumable
    ck = os.path.join(tmp, "killed.ck.h5")
    big = ["dim=512", "ffn_dim=2048", "vocab=16000", "seq=128", "mesh=ring:4", "shard=params", "checkpoint_io=parallel",
           "checkpoint_every=1", f"checkpoint={ck}", "steps=1000"]
    cmd = [MPIRUN, "-np", "4", "--oversubscribe", "--bind-to", "none", CTXPAR, "train", "--config", CONFIG,
           "out=" + os.path.join(tmp, "killed.h5")] + BASE + big
    env = dict(ENV, OMPI_MCA_orte_tmpdir_base=os.path.join(tmp, "killed.ompi"))
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = False
    import time
    t_end = time.time() + 120
    ranks = []  # the ctxpar processes mpirun started: SIGKILL goes to them (mpirun alone would leave them running)
    while time.time() < t_end and p.poll() is None:
        if len(ranks) < 4:
            ranks = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        if len(ranks) == 4 and os.path.exists(ck) and os.path.exists(ck + ".partial"):  # the next one being written
            for pid in ranks:
                os.kill(int(pid), signal.SIGKILL)
            killed = True
            break
        time.sleep(0.002)
    if p.poll() is None:
        p.kill()
    p.wait()
    if not killed:
        bad.append("no parallel checkpoint was caught mid-write")
    else:
        with h5py.File(ck, "r") as f:
            step = int(f.attrs["step"])
            whole = all(np.all(np.isfinite(np.array(f[g][k]))) for g in ("params", "adam_m", "adam_v") for k in f[g])
        r = run(tmp, "killed_resumed", 4, [a for a in big if not a.startswith("steps=") and not a.startswith("checkpoint")]
                + [f"steps={step + 1}", f"resume={ck}"])
        ok = whole and np.array_equal(r["steps"], [step])
        print(f"killed mid-write: the last complete checkpoint (step {step}) is whole and resumes", "ok" if ok else "FAIL")
        if not ok:
            bad.append("the last complete checkpoint after a kill")
    return bad


def case_data(tmp):
    rng = np.random.default_rng(7)
    V, eos = 256, 0
    tokens = rng.integers(1, V, size=4096)
    tokens[rng.integers(0, 4096, size=60)] = eos  # document ends
    tokens.astype("<u2").tofile(os.path.join(tmp, "t16.bin"))
    tokens.astype("<u4").tofile(os.path.join(tmp, "t32.bin"))
    with h5py.File(os.path.join(tmp, "t.h5"), "w") as f:
        f["tokens"] = tokens.astype(np.int32)
    common = ["steps=3", "mesh=ring:2", "docs=none", f"eos_id={eos}"]
    a = run(tmp, "bin16", 2, common + [f"data={tmp}/t16.bin", "data_dtype=uint16"])
    b = run(tmp, "bin32", 2, common + [f"data={tmp}/t32.bin", "data_dtype=uint32"])
    c = run(tmp, "h5", 2, common + [f"data={tmp}/t.h5"])
    d = run(tmp, "noeos", 2, ["steps=3", "mesh=ring:2", "docs=none", f"data={tmp}/t16.bin"])
    print(a["loss"], b["loss"], c["loss"], d["loss"])
    bad = []
    if not (np.array_equal(a["loss"], b["loss"]) and np.array_equal(a["loss"], c["loss"])):
        bad.append("token file formats disagree")
    if np.array_equal(a["loss"], d["loss"]):
        bad.append("eos_id document boundaries had no effect")
    r = run(tmp, "short", 2, ["steps=1", "mesh=ring:2", "docs=none", f"data={tmp}/t16.bin", "seq=8K"], expect_rc=2)
    if "fewer than seq" not in r.stderr:
        bad.append("short token file not reported")
    return bad


def case_learn(tmp):
    loss = run(tmp, "learn", 1, ["steps=30"])["loss"]
    print(loss)
    return [] if loss[-1] < loss[0] - 1.0 else [f"loss fell only from {loss[0]:.3f} to {loss[-1]:.3f}"]


def dry_run_estimate(np_, args):
    """The --dry-run memory estimate per rank in bytes (None, with the output printed, if absent)."""
    cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", "--bind-to", "none", CTXPAR, "train", "--config", CONFIG,
           "--dry-run"] + BASE + args
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    m = re.search(r"memory estimate per rank: ([0-9.]+) (KiB|MiB|GiB)", r.stdout)
    if not m:
        print(r.stdout, r.stderr)
        return None
    return float(m.group(1)) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)]


def case_memory(tmp):
    bad = []
    for remat in ["none", "full"]:
        args = ["steps=1", "mesh=ring:2", "seq=1K", "dim=256", "ffn_dim=512", "vocab=1000", f"remat={remat}"]
        est = dry_run_estimate(2, args)
        if est is None:
            return ["no memory estimate in --dry-run"]
        peak = run(tmp, "mem_" + remat, 2, args)["peak"].max()
        print(f"remat={remat}: estimate {est / 2**20:.2f} MiB, measured peak {peak / 2**20:.2f} MiB")
        if abs(peak - est) > 0.15 * peak:
            bad.append(f"remat={remat} estimate off by more than 15%")
    # The strategies' buffers: the same model and mesh under allgather (the whole sequence's K/V
    # and dK/dV) and ring (a visiting block and the next, both ways): everything else is equal,
    # so the difference of the measured peaks is the difference of the buffers, and the plan's
    # must match it (the ring's plan once counted its whole traffic as held at once).
    est, peak = {}, {}
    for st in ("allgather", "ring"):
        args = ["steps=1", "mesh=ring:4", "seq=4K", "heads=4", "kv_heads=4", "head_dim=32", f"strategy={st}"]
        est[st] = dry_run_estimate(4, args)
        if est[st] is None:
            return ["no memory estimate in --dry-run (%s)" % st]
        peak[st] = run(tmp, "mem_" + st, 4, args)["peak"].max()
    d_est, d_peak = est["allgather"] - est["ring"], peak["allgather"] - peak["ring"]
    print(f"allgather - ring: plan {d_est / 2**20:.2f} MiB, measured {d_peak / 2**20:.2f} MiB")
    if not (d_peak > 0 and abs(d_est - d_peak) <= 0.25 * d_peak):
        bad.append(f"allgather - ring buffers: plan {d_est / 2**20:.2f} MiB vs measured {d_peak / 2**20:.2f} MiB (> 25% apart)")
    return bad


def case_errors(tmp):
    # tp:4 over 2 K/V heads trains (each head on two tp ranks: oracle_train_tp4_kv_replicated);
    # tp:3 divides neither the 8 query heads nor the 2 K/V heads.
    r = run(tmp, "tp3", 3, ["steps=1", "mesh=tp:3"], expect_rc=2)
    return [] if "tp:3" in r.stderr and "heads = 8" in r.stderr else [f"tp:3 message does not name tp and heads: {r.stderr}"]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        bad = globals()["case_" + CASE](tmp)
    if bad:
        print("FAIL:", "; ".join(bad))
        return 1
    print("PASS:", CASE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
