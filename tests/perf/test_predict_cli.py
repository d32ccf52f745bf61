#!/usr/bin/env python3
"""`ctxpar predict` from the command line: table rows per strategy, --csv columns, sweeps, the
recommendation line, and a bad hardware name -> exit 2 with a clear message (no trace written)."""
import csv
import io
import os
import subprocess
import sys

exe = sys.argv[1]
fails = []


def run(*args):
    return subprocess.run([exe, "predict", "out=/tmp/ctxpar_test_predict.h5"] + list(args), capture_output=True, text=True)


def check(cond, what):
    if not cond:
        fails.append(what)


model = ["--config", "inputs/llama3-405b.toml", "hardware=h100-gtt"]
r = run(*model, "predict_mesh=tp:8,ring:16", "seq=1M", "predict_mode=prefill")
check(r.returncode == 0, "prefill table exits 0: %s" % r.stderr)
rows = [l for l in r.stdout.splitlines() if l and not l.startswith("#")]
check(len(rows) == 5, "prefill: one row per strategy (pass_kv, pass_q, allgather, ulysses, usp), got %d" % len(rows))
check(sum("invalid" in l for l in rows) == 0, "prefill on tp:8,ring:16: every strategy valid (usp on any mesh)")
usp = [l for l in rows if " usp " in l]
kv = [l for l in rows if " pass_kv " in l]
check(len(usp) == 1 and "the same as ring" in usp[0], "usp without a ulysses axis is noted as the ring")
check(usp and kv and usp[0].split()[6] == kv[0].split()[6], "usp with ulysses:1 is priced as pass_kv")
check(any("pass_kv" in l for l in rows) and any("pass_q" in l for l in rows), "prefill rows name pass_kv and pass_q")
check("# recommended: pass_kv" in r.stdout, "1M prefill recommends pass_kv:\n" + r.stdout)

r = run(*model, "predict_mesh=tp:8,ring:4", "seq=128000", "predict_mode=train", "--csv")
check(r.returncode == 0, "train csv exits 0")
data = list(csv.DictReader(io.StringIO(r.stdout)))
want = {"mode", "hardware", "mesh", "seq", "cached", "strategy", "time_s", "mfu_pct", "gemm_s", "attn_s", "other_s",
        "comm_s", "exposed_comm_s", "mem_gib", "fits", "recommended", "note"}
check(data and set(data[0].keys()) == want, "csv columns: %s" % (list(data[0].keys()) if data else r.stdout))
check([d["strategy"] for d in data] == ["allgather", "ulysses", "ring", "usp"], "train strategies in order")
check(sum(d["recommended"] == "*" for d in data) == 1, "exactly one recommended row")
valid = [d for d in data if d["time_s"] != "-"]
check(all(float(d["time_s"]) > 0 and 0 < float(d["mfu_pct"]) < 100 for d in valid), "times > 0 and MFU in (0, 100)")
check([d["note"] for d in data if d["strategy"] == "usp"] == ["the same as ring on this mesh"],
      "usp without a ulysses axis is noted as the ring it is")

r = run(*model, "predict_mesh=tp:8,ring:16", "predict_mode=prefill", "--csv", "--sweep", "seq=128K,256K,1M")
data = list(csv.DictReader(io.StringIO(r.stdout)))
check(r.returncode == 0 and len(data) == 15, "sweep of 3 lengths x 5 strategies -> 15 rows, got %d" % len(data))
kv = [float(d["time_s"]) for d in data if d["strategy"] == "pass_kv"]
check(kv == sorted(kv) and len(kv) == 3, "TTFT grows with the length: %s" % kv)

r = run(*model, "hardware=no-such-gpu", "predict_mesh=tp:8")
check(r.returncode == 2, "bad hardware name exits 2 (got %d)" % r.returncode)
check("no-such-gpu" in r.stdout + r.stderr and "h100-gtt" in r.stdout + r.stderr,
      "bad hardware message names the value and the valid profiles:\n" + r.stdout + r.stderr)

r = run(*model, "predict_mesh=tp:8,ring:4", "predict_mode=partial_prefill", "seq=128000", "miss_rate=1")
check(r.returncode == 2 and "cached" in r.stdout + r.stderr, "partial prefill without cached tokens is a usage error")

# predict_chips: the search over meshes. Every row's mesh has the asked chips, parses back as
# predict_mesh, and there prices the same; rows fit and come best first.
m8 = ["--config", "inputs/llama3-8b.toml", "hardware=h100-gtt", "seq=128K"]
r = run(*m8, "predict_chips=8", "--csv")
data = list(csv.DictReader(io.StringIO(r.stdout)))
check(r.returncode == 0 and 1 <= len(data) <= 8, "predict_chips=8: 1..8 rows, exit 0:\n" + r.stdout + r.stderr)


def chips_of(mesh):
    n = 1
    for axis in mesh.split(","):
        n *= int(axis.split(":")[1])
    return n


check(all(chips_of(d["mesh"]) == 8 and d["fits"] == "yes" for d in data), "every searched mesh has 8 chips and fits")
tps = [float(d["tokens_per_s"]) for d in data]
check(tps == sorted(tps, reverse=True), "ranked by throughput: %s" % tps)
check(len({(d["mesh"], d["strategy"], d["remat"]) for d in data}) == len(data), "no candidate listed twice")
for d in data[:2]:
    again = run(*m8, "predict_mesh=" + d["mesh"], "remat=" + d["remat"], "predict_precision=bf16", "--csv")
    same = [e for e in csv.DictReader(io.StringIO(again.stdout)) if e["strategy"] == d["strategy"]]
    check(again.returncode == 0 and len(same) == 1 and abs(float(same[0]["time_s"]) - float(d["time_s"])) <= 1e-4,
          "searched row %s %s %s prices the same as predict_mesh: %s" % (d["mesh"], d["strategy"], d["remat"], again.stdout))
r = run(*m8, "predict_chips=8")
check("# 8 chips:" in r.stdout and "best: " in r.stdout and "priced in bf16" in r.stdout,
      "the search says what it priced, the best, and that fp8_ffn is not runnable:\n" + r.stdout)

r = run("--config", "inputs/llama3-405b.toml", "hardware=h100-gtt", "seq=1M", "predict_mode=prefill", "predict_chips=128",
        "--csv")
data = list(csv.DictReader(io.StringIO(r.stdout)))
check(r.returncode == 0 and data and all(chips_of(d["mesh"]) == 128 and "dp:" not in d["mesh"] for d in data),
      "a prefill searches meshes without dp (one request on every chip):\n" + r.stdout)
check(data and all(d["remat"] == "-" for d in data), "a prefill has no remat")

r = run(*m8, "predict_chips=8", "predict_mesh=ring:8")
check(r.returncode == 2 and "give one" in r.stdout + r.stderr, "predict_chips with predict_mesh is refused")
r = run(*m8, "sweep=predict_mesh=ulysses:8,ring:8;tp:8,ring:8", "--csv")
meshes = sorted({d["mesh"] for d in csv.DictReader(io.StringIO(r.stdout))})
check(r.returncode == 0 and meshes == ["tp:8,ring:8", "ulysses:8,ring:8"],
      "a sweep over predict_mesh takes ';' between meshes and prints them as it takes them: %s" % meshes)

if fails:
    print("FAILED:\n  " + "\n  ".join(fails))
    sys.exit(1)
print("predict CLI: all checks passed")
