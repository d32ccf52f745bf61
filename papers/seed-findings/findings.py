#!/usr/bin/env python3
"""The seeds' findings on ctxpar's own runs: each claim of the MaxText announcement and the Meta
paper (../shared/seeds) that ctxpar can test on this machine, measured, with a table (CSV and
markdown on stdout) and a figure per finding in this folder.

  usp_ring      MaxText: USP (all-to-all inside a host, ring across) beats a long ring as the
                host-to-host link slows. 2 hosts x 2 ranks (tests/cluster), links from 10 Gbit/s
                down to 100 Mbit/s, one training step, measured and predicted.
  ulysses_cap   MaxText: Ulysses is capped by the heads. U <= KV heads: no replication;
                KV heads < U <= query heads: K/V replicated (bytes grow); U > query heads: refused.
  memory        All-gather holds the whole sequence's K/V, the ring one visiting block: weak
                scaling (1K tokens per rank, 1..8 ranks), the --dry-run plan and measured peaks.
  passkv_passq  Meta Eq. 1 / 5: pass-Q wins at low KV-cache miss rates, pass-KV at high ones;
                measured crossover against the predicted one (bench infer, 4 hosts x 1 rank).
  decode        Meta Table 8: decode TTIT grows with the CP size (bench infer, 4 hosts x 1 rank).
  (offload before remat: needs the GPU path; not measurable here, see README.md.)

Usage: /usr/bin/python3 papers/seed-findings/findings.py [FINDING ...] [--quick]
(no finding: all). Needs root and `ip netns` for the cluster findings (they exit with a message
otherwise). Writes FINDING.csv and FINDING.png here; the verdicts are in README.md.
"""
import csv
import os
import re
import subprocess
import sys

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "local-validation"))
import predict_lib as pl  # noqa: E402
import validate_hosts as vh  # noqa: E402
from validate import ENV, MODEL  # noqa: E402

QUICK = "--quick" in sys.argv


def mpirun(np_, args, ok=(0,)):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), pl.ctxpar_binary()] + args
    r = subprocess.run(cmd, cwd=pl.ROOT, capture_output=True, text=True, env=ENV)
    if r.returncode not in ok:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-3000:]))
    return r.returncode, r.stdout + r.stderr


def summary(path, key):
    with h5py.File(path, "r") as f:
        return float(f["summary"].attrs[key])


def span_bytes(path, phase_name, rank=0):
    """Bytes of one rank's spans of a phase, per measured step (the trace's /spans)."""
    names = {"all_to_all": 5, "all_gather": 6, "comm_send_recv": 3}
    with h5py.File(path, "r") as f:
        s = f["spans"][:]
        warm = int(f["summary"].attrs["warmup_steps_excluded"])
        steps = int(f["summary"].attrs["measured_steps"])
    sel = s[(s["rank"] == rank) & (s["phase"] == names[phase_name]) & (s["step"] >= warm)]
    return float(sel["bytes"].sum()) / max(1, steps)


def write_csv(name, header, rows):
    with open(os.path.join(HERE, name + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def plt_():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ---- USP vs ring as the host-to-host link slows (MaxText) ------------------------------------------
def usp_ring():
    rates = ["10gbit", "1gbit", "300mbit", "100mbit"] if not QUICK else ["10gbit", "100mbit"]
    seq = 4096
    host_toml = "/tmp/ctxpar_hw_onehost_findings.toml"
    mpirun(2, ["bench", "calibrate", "threads=1", "out=/tmp/ctxpar_cal.h5", "hardware=" + host_toml] + MODEL)
    rows = []
    for rate in rates:
        prof = vh.calibrate(rate, layouts=[(2, 2)], host_toml=host_toml)[(2, 2)]
        meas, pred = {}, {}
        for st, mesh in (("ring", "ring:4"), ("usp", "ulysses:2,ring:2")):
            path = "/tmp/ctxpar_find_usp_%s_%s.h5" % (st, rate)
            vh.cluster(2, 2, rate, ["train"] + MODEL + ["threads=1", "seq=%d" % seq, "strategy=" + st, "mesh=" + mesh,
                                                         "steps=3", "warmup=1", "out=" + path])
            meas[st] = summary(path, "time_s_median")
            rows_p = pl.predict(MODEL + ["hardware=" + prof, "predict_mode=train", "seq=%d" % seq, "predict_mesh=" + mesh])
            pred[st] = float(pl.row_of(rows_p, st)["time_s"])
        rows.append([rate, "%.3f" % meas["ring"], "%.3f" % meas["usp"], "%.2f" % (meas["ring"] / meas["usp"]),
                     "%.3f" % pred["ring"], "%.3f" % pred["usp"], "%.2f" % (pred["ring"] / pred["usp"])])
        print(rows[-1], flush=True)
    header = ["link (each way)", "ring s/step", "usp s/step", "ring/usp measured", "ring pred s", "usp pred s", "ring/usp predicted"]
    write_csv("usp_ring", header, rows)
    plt = plt_()
    mbit = [float(re.match(r"([0-9.]+)", r).group(1)) * (1000 if "gbit" in r else 1) for r in rates]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (st, c) in enumerate((("ring", "C0"), ("usp", "C1"))):
        ax.plot(mbit, [float(r[1 + i]) for r in rows], "o-", color=c, label=st + " measured")
        ax.plot(mbit, [float(r[4 + i]) for r in rows], "s--", color=c, alpha=0.6, label=st + " predicted")
    ax.set_xscale("log")
    ax.set_xlabel("host-to-host link [Mbit/s], each way")
    ax.set_ylabel("training step [s]")
    ax.set_title("2 hosts x 2 ranks, S=%d: ring:4 vs usp (ulysses:2 in a host, ring:2 across)" % seq, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "usp_ring.png"), dpi=120)
    print(md_table(header, rows))


# ---- Ulysses capped by the heads ---------------------------------------------------------------------
def ulysses_cap():
    heads, kv = 8, 2
    seq = 1024
    model = [a for a in MODEL if not a.startswith(("heads=", "kv_heads="))] + ["heads=%d" % heads, "kv_heads=%d" % kv]
    rows = []
    for U in (1, 2, 4, 8, 16):
        path = "/tmp/ctxpar_find_uly_%d.h5" % U
        args = ["train"] + model + ["threads=1", "seq=%d" % seq, "strategy=ulysses", "mesh=ring:%d" % U, "steps=2", "warmup=1",
                                    "out=" + path]
        if U > heads:
            rc, out = mpirun(U, args + ["--dry-run"], ok=(0, 2))
            msg = next((l.strip() for l in out.splitlines() if "ulysses" in l.lower() and ("head" in l.lower())), out.strip()[-200:])
            rows.append([U, "-", "-", "-", "-", "-", "refused (exit %d): %s" % (rc, msg)])
            print(rows[-1], flush=True)
            continue
        rc, out = mpirun(U, args)
        step = summary(path, "time_s_median")
        moved = span_bytes(path, "all_to_all") if U > 1 else 0.0
        rows.append([U, kv // U if U <= kv else "1 (each replicated on %d ranks)" % (U // kv), moved, step])
        print(rows[-1], flush=True)
    # Expected bytes from the U = 2 point (no replication there): a rank sends (U-1)/U of its S/U
    # tokens' rows, so bytes scale as (U-1)/U^2; Q-like tensors (Q, O, dO, dQ) are H_q wide, K-like
    # (K, V, dK, dV) H_kv wide, or U wide once K/V heads are replicated to one per rank.
    base = next(r for r in rows if r[0] == 2)[2]
    for r in rows:
        U = r[0]
        if U > heads or U < 2:
            if U == 1:
                r[2:] = ["0", "0", "0", "%.3f" % r[3], "ran (no all-to-all)"]
            continue
        scale = ((U - 1) / U ** 2) / (1 / 4)
        no_rep = base * scale
        rep = no_rep * (2 * heads + 2 * max(kv, U)) / (2 * heads + 2 * kv)
        r[2:] = ["%.0f" % (r[2] / 1e3), "%.0f" % (rep / 1e3), "%.0f" % (no_rep / 1e3), "%.3f" % r[3], "ran"]
    header = ["U (ranks)", "KV heads per rank", "all-to-all KB/step (rank 0, measured)",
              "expected with replication KB (from U=2)", "if K/V were not replicated KB", "step s", "status"]
    write_csv("ulysses_cap", header, rows)
    plt = plt_()
    ran = [r for r in rows if r[-1] == "ran"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r[0] for r in ran], [float(r[2]) for r in ran], "o-", label="measured (trace spans)")
    ax.plot([r[0] for r in ran], [float(r[3]) for r in ran], "x:", label="expected with replication (from U=2)")
    ax.plot([r[0] for r in ran], [float(r[4]) for r in ran], "s--", label="without K/V replication")
    ax.axvline(kv, color="0.6", lw=0.8)
    ax.text(kv, ax.get_ylim()[1] * 0.95, " KV heads", fontsize=7)
    ax.axvline(heads, color="0.3", lw=0.8)
    ax.text(heads, ax.get_ylim()[1] * 0.95, " query heads (max U)", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("Ulysses degree U")
    ax.set_ylabel("all-to-all bytes per rank per step [KB]")
    ax.set_title("heads %d / KV heads %d, S=%d, training step" % (heads, kv, seq), fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "ulysses_cap.png"), dpi=120)
    print(md_table(header, rows))


# ---- all-gather memory vs the ring's ---------------------------------------------------------------
def parse_mib(text, label):
    m = re.search(label + r" ([0-9.]+) (B|KiB|MiB|GiB)", text)
    if not m:
        return float("nan")
    return float(m.group(1)) * {"B": 2 ** -20, "KiB": 2 ** -10, "MiB": 1, "GiB": 1024}[m.group(2)]


def memory():
    per_rank = 1024
    ps = (1, 2, 4, 8) if not QUICK else (1, 2, 4)
    rows = []
    for P in ps:
        seq = per_rank * P
        row = [P, seq]
        for st in ("allgather", "ring"):
            path = "/tmp/ctxpar_find_mem_%s_%d.h5" % (st, P)
            args = ["train"] + MODEL + ["threads=1", "seq=%d" % seq, "strategy=" + st, "mesh=ring:%d" % P, "steps=1",
                                        "warmup=0", "out=" + path]
            _, plan = mpirun(P, args + ["--dry-run"])
            mpirun(P, args)
            peak = summary(path, "peak_bytes_max") / 2 ** 20
            row += ["%.1f" % parse_mib(plan, "strategy buffers"), "%.1f" % parse_mib(plan, "memory estimate per rank:"),
                    "%.1f" % peak]
        rows.append(row)
        print(row, flush=True)
    header = ["ranks", "S", "allgather buffers MiB (plan)", "allgather total MiB (plan)", "allgather peak MiB (measured)",
              "ring buffers MiB (plan)", "ring total MiB (plan)", "ring peak MiB (measured)"]
    write_csv("memory", header, rows)
    plt = plt_()
    fig, ax = plt.subplots(figsize=(6, 4))
    S = [r[1] for r in rows]
    ax.plot(S, [float(r[4]) for r in rows], "o-", color="C0", label="allgather peak (measured)")
    ax.plot(S, [float(r[2]) for r in rows], "o:", color="C0", label="allgather strategy buffers (plan)")
    ax.plot(S, [float(r[7]) for r in rows], "s-", color="C1", label="ring peak (measured)")
    ax.plot(S, [float(r[5]) for r in rows], "s:", color="C1", label="ring strategy buffers (plan)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence S (1K tokens per rank: 1, 2, 4, 8 ranks)")
    ax.set_ylabel("per rank [MiB]")
    ax.set_title("weak scaling, training step: tracked peak per rank and the plan's strategy buffers", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "memory.png"), dpi=120)
    print(md_table(header, rows))


# ---- bench infer on 4 hosts: pass-KV vs pass-Q, decode TTIT vs CP ---------------------------------
_INFER = {}


def bench_infer_cluster():
    """bench infer (inputs/chat-bench.toml's model, 2K context) on 4 hosts x 1 rank at 1 Gbit/s,
    --csv; returns its tables as lists of dict rows (cached: two findings read one run)."""
    if _INFER:
        return _INFER
    cfg = os.path.join(pl.ROOT, "inputs", "chat-bench.toml")
    out = vh.cluster(4, 1, "1gbit", ["bench", "infer", "--config", cfg, "--csv", "bench_iters=%d" % (9 if QUICK else 21),
                                     "out=/tmp/ctxpar_find_infer.h5"])
    open("/tmp/ctxpar_find_infer.txt", "w").write(out)
    # --csv prints the three tables back to back, each with its header line.
    tables, cur = [], None
    for line in out.splitlines():
        cells = line.strip().split(",")
        if cells[0] in ("miss_pct", "cp", "mode"):
            cur = {"header": cells, "rows": []}
            tables.append(cur)
        elif cur is not None and len(cells) == len(cur["header"]):
            cur["rows"].append(dict(zip(cur["header"], cells)))
    _INFER["tables"] = tables
    _INFER["text"] = out
    with h5py.File("/tmp/ctxpar_find_infer.h5", "r") as f:
        _INFER["cross"] = (int(f.attrs["infer_crossover_measured_index"]), int(f.attrs["infer_crossover_predicted_index"]))
    return _INFER


def passkv_passq():
    r = bench_infer_cluster()
    t1 = next(t for t in r["tables"] if "pass_kv_ms" in t["header"])
    header = ["miss %", "new T", "cached", "pass-KV ms", "pass-Q ms", "faster (sign test)", "pred KV ms", "pred Q ms",
              "model's choice", "Meta Eq. 5"]
    keys = ["miss_pct", "T", "P", "pass_kv_ms", "pass_q_ms", "faster", "pred_kv_ms", "pred_q_ms", "auto", "eq5"]
    rows = [[row[k] for k in keys] for row in t1["rows"]]
    write_csv("passkv_passq", header, rows)
    misses = [0.01, 0.025, 0.05, 0.10, 0.20, 0.50, 1.0]
    m, p = r["cross"]
    name = lambda i: "undetermined" if i < 0 else ("none" if i >= len(misses) else "%.1f%%" % (100 * misses[i]))
    plt = plt_()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [float(row[0]) for row in rows]
    ax.plot(x, [float(row[3]) for row in rows], "o-", color="C0", label="pass-KV measured")
    ax.plot(x, [float(row[4]) for row in rows], "o-", color="C1", label="pass-Q measured")
    ax.plot(x, [float(row[6]) for row in rows], "s--", color="C0", alpha=0.6, label="pass-KV predicted")
    ax.plot(x, [float(row[7]) for row in rows], "s--", color="C1", alpha=0.6, label="pass-Q predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("KV-cache miss rate T/(T+P) [%]")
    ax.set_ylabel("partial prefill TTFT [ms]")
    ax.set_title("4 hosts x 1 rank, 1 Gbit/s: crossover measured %s, predicted %s" % (name(m), name(p)), fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "passkv_passq.png"), dpi=120)
    print(md_table(header, rows))
    print("crossover (pass-Q below, pass-KV from): measured %s, predicted %s" % (name(m), name(p)))


def decode():
    r = bench_infer_cluster()
    t2 = next(t for t in r["tables"] if "ttit_ms" in t["header"])
    header = ["CP ranks", "replicas", "algo", "TTIT ms", "attn ms/step", "exposed ms/step", "sent KB/step", "#wrong"]
    keys = ["cp", "replicas", "algo", "ttit_ms", "attn_ms", "exposed_ms", "sent_kb", "wrong"]
    rows = [[row[k] for k in keys] for row in t2["rows"]]
    write_csv("decode", header, rows)
    plt = plt_()
    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, c in (("pass_q", "C1"), ("allgather", "C2")):
        sel = [row for row in rows if algo in row[2]]
        ax.plot([int(row[0]) for row in sel], [float(row[3]) for row in sel], "o-", color=c, label=sel[0][2] if sel else algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("CP ranks (one per host; 4 hosts, the rest as replicas)")
    ax.set_ylabel("decode TTIT [ms]")
    ax.set_title("bench infer decode, 2K context, 4 hosts x 1 rank at 1 Gbit/s", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "decode.png"), dpi=120)
    print(md_table(header, rows))


FINDINGS = {"usp_ring": usp_ring, "ulysses_cap": ulysses_cap, "memory": memory, "passkv_passq": passkv_passq, "decode": decode}

if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or list(FINDINGS)
    bad = [n for n in names if n not in FINDINGS]
    if bad:
        sys.exit("unknown finding %s; valid: %s" % (", ".join(bad), ", ".join(FINDINGS)))
    for n in names:
        print("## " + n, flush=True)
        FINDINGS[n]()
