#!/usr/bin/python3
"""Host offload (`offload=optimizer`, then `,layer_inputs`, `,attn_out`, `,params`) on the emulated GPU backend.

1. Round trip bit-exact: `ctxpar_emu train device=cuda` (tiny model with 5 layers, 2 ranks, 2 steps)
   without offload, with the AdamW moments offloaded (chunks of 10000 elements, so large tensors
   stream through the GPU in several), with the layer inputs offloaded too, with the attention
   outputs too (remat=none), and with the fp32 master weights too: the losses and every dataset of
   the final checkpoint (parameters, both moments) are identical bit for bit.
2. The GPU memory each step of offload saves: the trace's device high-water mark falls by at least
   90% of what `--dry-run` predicts (its "GPU memory per rank" line), and the copies are traced:
   the spans of phase offload carry 16 bytes per parameter element per step for the moments (and
   with params 8 more per element streamed in and out, 4 per element of the embedding and norms,
   which stay on the GPU and only go out), and
   the layer inputs and attention outputs brought back in each backward (the 3 newest of each stay
   on the GPU).
On the CUDA-runtime double work not ordered by an event runs late, never early: taking away the
compute stream's wait for a copy in (moments or layer inputs) makes this test fail (checked by
hand), but a copy out not ordered after the write it reads would still run after it here, so those
ordering points are checked by reading the code only.
3. shard=optimizer on the device, alone and with the shard's moments offloaded: the bits of the
   unsharded run (losses, every checkpoint dataset).
4. shard=grads and shard=params on the device, on 2 and 3 ranks: after one step the unsharded run's
   loss and checkpoint within the sharded-state rule (one_step_differs), on 2 ranks the bits of
   two steps, and the GPU memory they save at least 90% of the plan's.
5. Every shard level with offload=optimizer,params (the host holds this rank's pieces of the master
   weights), on 2 and 3 ranks: the bits of the same level without offload, the GPU memory saved at
   least 90% of the plan's; on 3 ranks resumed for a step at optimizer and params, written by the
   parallel writer: the bits without offload.
Its refusals are cases of test_attn_device.py (params without optimizer, attn_out with remat, a
name that is not a thing to offload, offload outside train) and of tests/cli/test_bad_input.py (offload on the CPU).

usage: test_offload.py CTXPAR_EMU MPIRUN WORKDIR
"""
import os
import re
import subprocess
import sys

import h5py
import numpy as np

EMU, MPIRUN, WORK = sys.argv[1:4]
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs", "tiny.toml")
STEPS = 2
failures = []


def mpirun(binary, np_, args, timeout=600):
    cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np_), binary, *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


LAYERS, SEQ, RANKS, DIM, QW, HQ = 5, 64, 2, 128, 8 * 16, 8  # tiny.toml: 8 heads of 16
common = ["train", "--config", TINY, f"seq={SEQ}", f"layers={LAYERS}", f"steps={STEPS}", "warmup=0", "device=cuda",
          "offload_chunk=10000", f"checkpoint_every={STEPS}"]
UNIT = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}
runs = {}
STEPS_OF_OFFLOAD = ("optimizer", "optimizer,layer_inputs", "optimizer,layer_inputs,attn_out",
                    "optimizer,layer_inputs,attn_out,params")
for off in ("none",) + STEPS_OF_OFFLOAD:
    tag = off.replace(",", "+")
    ck, tr = os.path.join(WORK, f"ck_{tag}.h5"), os.path.join(WORK, f"tr_{tag}.h5")
    for f in (ck, tr):
        if os.path.exists(f):
            os.remove(f)
    p = mpirun(EMU, RANKS, common + [f"offload={off}", f"checkpoint={ck}", f"out={tr}"])
    print(p.stdout[-900:])
    if p.returncode != 0:
        failures.append(f"train offload={off}: exit {p.returncode}\n{p.stderr[-2000:]}")
        continue
    dry = mpirun(EMU, RANKS, common + [f"offload={off}", "--dry-run"])
    plan = {}
    line = re.search(r"GPU memory per rank: (.*)", dry.stdout)
    for m in re.finditer(r"([\d.]+) (B|KiB|MiB|GiB) without offload|offload=([\w,]+): ([\d.]+) (B|KiB|MiB|GiB)",
                         line.group(1) if line else ""):
        if m.group(1):
            plan["none"] = float(m.group(1)) * UNIT[m.group(2)]
        else:
            plan[m.group(3)] = float(m.group(4)) * UNIT[m.group(5)]
    with h5py.File(tr, "r") as f:
        steps = f["steps"][:]
        spans = f["spans"][:]
        names = [x.decode() if isinstance(x, bytes) else x for x in f["spans"].attrs["phase_names"]]
        per_step = float(f.attrs.get("offload_bytes_per_step", -1))
    moved = float(spans["bytes"][spans["phase"] == names.index("offload")].sum())
    runs[off] = dict(ck=datasets(ck), loss=steps["loss"], peak=int(steps["device_peak_bytes"].max()), plan=plan,
                     moved=moved, log=p.stdout, per_step=per_step)

if len(runs) == 5:
    base = runs["none"]
    elems = sum(v.size for k, v in base["ck"].items() if k.startswith("params/"))
    # Resident on the GPU with offload=params: the embedding table and the norm weights.
    resident = sum(v.size for k, v in base["ck"].items() if k.startswith("params/") and
                   (k.endswith("norm") or k.endswith("/emb")))
    print(f"{elems} parameter elements, {resident} of them resident (embedding, norms)")
    S_loc = SEQ // RANKS
    inputs_in = (LAYERS + 1 - 3) * S_loc * DIM * 4  # x_0 .. x_L in 3 slots: all but 3 come back
    outs_in = (LAYERS - 3) * S_loc * (QW + HQ) * 4  # O and LSE of every layer in 3 slots
    expect_moved = {"none": 0,
                    "optimizer": RANKS * STEPS * 16 * elems,
                    "optimizer,layer_inputs": RANKS * STEPS * (16 * elems + inputs_in),
                    "optimizer,layer_inputs,attn_out": RANKS * STEPS * (16 * elems + inputs_in + outs_in),
                    "optimizer,layer_inputs,attn_out,params":
                        RANKS * STEPS * (16 * elems + 8 * (elems - resident) + 4 * resident + inputs_in + outs_in)}
    prev = "none"
    for off in STEPS_OF_OFFLOAD:
        r = runs[off]
        if not np.array_equal(base["loss"], r["loss"]):
            failures.append(f"offload={off}: losses {r['loss'].tolist()} differ from {base['loss'].tolist()}")
        differ = [k for k in base["ck"] if k not in r["ck"] or not np.array_equal(base["ck"][k], r["ck"][k])]
        print(f"offload={off}: checkpoint {len(base['ck'])} datasets, {len(differ)} differ; losses {r['loss'].tolist()}")
        if differ or len(base["ck"]) != len(r["ck"]):
            failures.append(f"offload={off}: checkpoints differ in {differ[:8]}")
        plan = base["plan"]
        if prev not in plan or off not in plan:
            failures.append(f"--dry-run's GPU memory line lacks {prev!r} or {off!r}: {plan}")
        else:
            predicted, measured = plan[prev] - plan[off], runs[prev]["peak"] - r["peak"]
            print(f"offload={off}: GPU high-water mark {runs[prev]['peak']} -> {r['peak']} bytes: saved {measured}, "
                  f"plan {predicted:.0f}")
            if not (predicted > 0 and measured >= 0.9 * predicted):
                failures.append(f"offload={off} saved {measured} bytes of GPU memory, the plan said {predicted:.0f}")
        print(f"offload={off}: spans of phase offload carry {r['moved']:.0f} bytes, expected {expect_moved[off]}")
        if r["moved"] != expect_moved[off]:
            failures.append(f"offload={off}: offload spans carry {r['moved']:.0f} bytes, expected {expect_moved[off]}")
        # The trace's bytes per step (rank 0): every copy out and in.
        total = (16 * elems + ("layer_inputs" in off) * (LAYERS + LAYERS + 1 - 3) * S_loc * DIM * 4 +
                 ("attn_out" in off) * (LAYERS + LAYERS - 3) * S_loc * (QW + HQ) * 4 +
                 ("params" in off) * (8 * (elems - resident) + 4 * resident))
        print(f"offload={off}: trace offload_bytes_per_step {r['per_step']:.0f}, expected {total}")
        if r["per_step"] != total:
            failures.append(f"offload={off}: offload_bytes_per_step {r['per_step']} in the trace, expected {total}")
        if f"offload={off}:" not in r["log"]:
            failures.append(f"offload={off}: no offload summary line in the train log")
        prev = off

# shard=optimizer on the device (each rank keeps and updates its pieces of the master weights and
# moments, then all-gathers the pieces), alone and with the shard's moments offloaded: the bits of
# the unsharded run, losses and every dataset of the checkpoint.
if "none" in runs:
    for off in ("none", "optimizer"):
        ck = os.path.join(WORK, f"ck_shard_{off}.h5")
        if os.path.exists(ck):
            os.remove(ck)
        p = mpirun(EMU, RANKS, common + [f"offload={off}", "shard=optimizer", f"checkpoint={ck}",
                                         f"out={os.path.join(WORK, f'tr_shard_{off}.h5')}"])
        if p.returncode != 0:
            failures.append(f"train shard=optimizer offload={off}: exit {p.returncode}\n{p.stderr[-2000:]}")
            continue
        with h5py.File(os.path.join(WORK, f"tr_shard_{off}.h5"), "r") as f:
            loss = f["steps"]["loss"][:]
        got = datasets(ck)
        differ = [k for k in runs["none"]["ck"] if k not in got or not np.array_equal(runs["none"]["ck"][k], got[k])]
        print(f"shard=optimizer offload={off}: {len(differ)} of {len(got)} checkpoint datasets differ; losses {loss.tolist()}")
        if differ or not np.array_equal(loss, runs["none"]["loss"]):
            failures.append(f"shard=optimizer offload={off}: not the bits of the unsharded run ({differ[:8]})")

# shard=grads and params on the device (gradients reduce-scattered per unit on the device
# communicator; at params each unit's weights gathered one unit ahead, its bf16 copy made per
# unit): the loss and the checkpoint of the unsharded run after one step within the sharded-state
# rule (a reduce-scatter sums in another order than the all-reduce; one_step_differs,
# tests/README.md), on 2 ranks and on 3 (pieces that 3 does not divide), on 2 ranks the bits of two
# steps; and the GPU memory each level saves against
# shard=none at least 90% of what --dry-run's "GPU memory per rank" line says.
# Every level with its pieces of the master weights offloaded too (offload=optimizer,params: the
# host holds only this rank's pieces; at optimizer and grads the GPU's copies are all-gathered from
# them after each update, at params each unit is copied in and gathered before its use): the bits
# of the same level without offload, and the GPU memory it saves at least 90% of the plan's. On 3
# ranks, resumed from the unsharded checkpoint for a third step with the parallel writer, at
# optimizer and params with and without offload: the same bits (the master read as pieces, written
# from pieces).
def gpu_plan(args):
    """--dry-run's GPU memory per rank: (without offload, this run's)."""
    dry = mpirun(EMU, args[0], args[1] + ["--dry-run"])
    line = re.search(r"GPU memory per rank: ([^\n]*)", dry.stdout)
    if not line:
        return None
    first = re.match(r"([\d.]+) (B|KiB|MiB|GiB)", line.group(1))
    this = re.search(r"([\d.]+) (B|KiB|MiB|GiB) \(this run\)", line.group(1)) or first
    return float(first.group(1)) * UNIT[first.group(2)], float(this.group(1)) * UNIT[this.group(2)]


def close(a, b, rel=2e-5):
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= rel * np.maximum(np.abs(b), 1.0)))


# tiny.toml's AdamW (lr 3e-3, the defaults beta1 0.9, beta2 0.95, eps 1e-8).
LR, BETA1, BETA2, EPS = 3e-3, 0.9, 0.95, 1e-8


def one_step_differs(got, ref, rel=2e-5):
    """The datasets of a one-step checkpoint `got` that are not `ref`'s up to the order of the
    gradients' sums (the sharded-state rule, tests/README.md): each moment (linear in the
    gradient) within `rel` of its tensor's largest magnitude, and each weight within `rel`
    (floor 1) plus what AdamW's own update explains, LR |u_got - u_ref| with u = m^ / (sqrt(v^) + eps)
    from each run's moments (an element whose gradient is within rounding of 0 may take the
    other sign)."""
    def u(ck, name):
        return (ck["adam_m/" + name] / (1 - BETA1)) / (np.sqrt(ck["adam_v/" + name] / (1 - BETA2)) + EPS)
    bad = []
    for k, b in ref.items():
        a = got.get(k)
        if a is None or a.shape != b.shape:
            bad.append(k)
        elif k.startswith("params/"):
            name = k[len("params/"):]
            allowed = LR * np.abs(u(got, name) - u(ref, name)) + rel * np.maximum(np.abs(b), 1.0)
            if not np.all(np.abs(a.astype(float) - b) <= allowed):
                bad.append(k)
        elif not np.all(np.abs(a.astype(float) - b) <= rel * np.abs(b).max()):
            bad.append(k)
    return bad


def saved_as_planned(what, base, r, predicted):
    measured = base["peak"] - r["peak"]
    print(f"{what}: GPU high-water mark {base['peak']} -> {r['peak']} bytes: saved {measured}, plan {predicted:.0f}")
    if not (predicted > 0 and measured >= 0.9 * predicted):
        failures.append(f"{what} saved {measured} bytes of GPU memory, the plan said {predicted:.0f}")


OFF_PARAMS = "optimizer,params"
for ranks, seq in ((RANKS, SEQ), (3, 66)):
    shard_runs = {}
    for level in ("none", "optimizer", "grads", "params"):
        for off in ("none", OFF_PARAMS):
            tag = f"{level}_{off.replace(',', '+')}_{ranks}"
            ck, tr = os.path.join(WORK, f"ck_dev_{tag}.h5"), os.path.join(WORK, f"tr_dev_{tag}.h5")
            for f in (ck, tr):
                if os.path.exists(f):
                    os.remove(f)
            args = common + [f"seq={seq}", f"shard={level}", f"offload={off}", f"checkpoint={ck}", f"out={tr}"]
            p = mpirun(EMU, ranks, args)
            if p.returncode != 0:
                failures.append(f"train device=cuda shard={level} offload={off} on {ranks}: exit {p.returncode}\n"
                                f"{p.stderr[-2000:]}")
                continue
            with h5py.File(tr, "r") as f:
                steps = f["steps"][:]
            shard_runs[level, off] = dict(ck=datasets(ck), ck_path=ck, loss=steps["loss"],
                                          peak=int(steps["device_peak_bytes"].max()), plan=gpu_plan((ranks, args)))
    if len(shard_runs) < 8:
        continue
    if any(r["plan"] is None for r in shard_runs.values()):
        failures.append(f"no 'GPU memory per rank' line in --dry-run on {ranks} ranks")
        continue
    base = shard_runs["none", "none"]
    # grads and params against none after one step: from the second step on, a weight that an
    # fp32 sum in another order moved across a bf16 rounding boundary enters the GEMMs one bf16
    # ulp away (2^-8 relative), which no fp32 rule bounds (measured on 3 ranks: moments 0.5% of
    # their tensors' largest apart after two steps, 2e-7 after one). On 2 ranks each sum has two
    # terms, the same in any order: the two-step checkpoints are compared bit for bit as well.
    one = {}
    for level in ("none", "grads", "params"):
        ck = os.path.join(WORK, f"ck_dev_{level}_one_{ranks}.h5")
        if os.path.exists(ck):
            os.remove(ck)
        args = common + [f"seq={seq}", f"shard={level}", "steps=1", "checkpoint_every=1", f"checkpoint={ck}",
                         f"out={os.path.join(WORK, 'tr_one.h5')}"]
        p = mpirun(EMU, ranks, args)
        if p.returncode != 0:
            failures.append(f"train device=cuda shard={level} steps=1 on {ranks}: exit {p.returncode}\n{p.stderr[-2000:]}")
            continue
        with h5py.File(os.path.join(WORK, "tr_one.h5"), "r") as f:
            one[level] = dict(ck={k: v.astype(float) for k, v in datasets(ck).items()}, loss=f["steps"][:]["loss"])
    for level in ("grads", "params"):
        r = shard_runs[level, "none"]
        if "none" in one and level in one:
            differ = one_step_differs(one[level]["ck"], one["none"]["ck"])
            print(f"device shard={level} on {ranks} ranks: loss {one[level]['loss'].tolist()} (none "
                  f"{one['none']['loss'].tolist()}); after one step {len(differ)} of {len(one['none']['ck'])} checkpoint "
                  f"datasets beyond the sharded-state rule")
            if not close(one[level]["loss"], one["none"]["loss"]) or differ:
                failures.append(f"device shard={level} on {ranks} ranks: not the unsharded run's ({differ[:8]})")
        if ranks == 2:
            differ = [k for k in base["ck"] if k not in r["ck"] or not np.array_equal(r["ck"][k], base["ck"][k])]
            if differ or not np.array_equal(r["loss"], base["loss"]):
                failures.append(f"device shard={level} on 2 ranks: two steps not the bits of none ({differ[:8]})")
        saved_as_planned(f"device shard={level} on {ranks} ranks", base, r, base["plan"][0] - r["plan"][0])
    for level in ("optimizer", "grads", "params"):
        ref, r = shard_runs[level, "none"], shard_runs[level, OFF_PARAMS]
        differ = [k for k in ref["ck"] if k not in r["ck"] or not np.array_equal(r["ck"][k], ref["ck"][k])]
        print(f"device shard={level} offload={OFF_PARAMS} on {ranks} ranks: {len(differ)} of {len(ref['ck'])} "
              f"checkpoint datasets differ from offload=none; losses {r['loss'].tolist()}")
        if differ or not np.array_equal(r["loss"], ref["loss"]):
            failures.append(f"device shard={level} offload={OFF_PARAMS} on {ranks} ranks: not the bits without offload "
                            f"({differ[:8]})")
        saved_as_planned(f"device shard={level} offload={OFF_PARAMS} on {ranks} ranks", ref, r,
                         r["plan"][0] - r["plan"][1])
    if ranks != 3:
        continue
    resumed = {}
    for level in ("optimizer", "params"):
        for off in ("none", OFF_PARAMS):
            ck = os.path.join(WORK, f"ck_resumed_{level}_{off.replace(',', '+')}.h5")
            if os.path.exists(ck):
                os.remove(ck)
            args = common + [f"seq={seq}", "steps=3", "checkpoint_every=3", "checkpoint_io=parallel",
                             f"resume={base['ck_path']}", f"shard={level}", f"offload={off}", f"checkpoint={ck}",
                             f"out={os.path.join(WORK, 'tr_resumed.h5')}"]
            p = mpirun(EMU, ranks, args)
            if p.returncode != 0:
                failures.append(f"resumed shard={level} offload={off}: exit {p.returncode}\n{p.stderr[-2000:]}")
                continue
            resumed[level, off] = datasets(ck)
        if (level, "none") in resumed and (level, OFF_PARAMS) in resumed:
            ref, got = resumed[level, "none"], resumed[level, OFF_PARAMS]
            differ = [k for k in ref if k not in got or not np.array_equal(got[k], ref[k])]
            print(f"resumed at shard={level} on 3 ranks, parallel writer: {len(differ)} of {len(ref)} datasets differ "
                  f"with offload={OFF_PARAMS}")
            if differ or len(ref) != len(got):
                failures.append(f"resumed at shard={level} offload={OFF_PARAMS}: not the bits without offload "
                                f"({differ[:8]})")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
