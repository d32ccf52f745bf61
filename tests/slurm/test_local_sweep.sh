#!/usr/bin/env bash
# jobs/sweep.py --local: a 2-run sweep (ring, allgather on 2 ranks) through jobs/ctxpar.sbatch with
# mpirun; every run directory checked with the loader (tests/slurm/check_runs.py); a second call
# keeps the finished runs; a train sweep of the four strategies ends with one table (analysis.summary:
# a row per run, the losses equal); a configuration ctxpar rejects fails its run (exit 2, nothing
# traced; its row says so) and the sweep (exit 1).
#   test_local_sweep.sh CTXPAR WORKDIR
set -euo pipefail
CTXPAR=$(realpath "$1"); WORK=$2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
rm -rf "$WORK"; mkdir -p "$WORK"
SMALL=(heads=4 kv_heads=4 head_dim=32 steps=2 warmup=1 bench_max_bytes=4K bench_iters=1)
fail() { echo "FAIL: $*"; exit 1; }

"$PY" "$REPO/jobs/sweep.py" --local --quiet --nodes 1 --ranks-per-node 2 --strategies ring,allgather \
  --seq 512 --ctxpar "$CTXPAR" --out "$WORK/sweep" -- "${SMALL[@]}"
"$PY" "$REPO/tests/slurm/check_runs.py" --ranks 2 --steps 3 --launcher mpirun --sweep 2 "$WORK/sweep"

out=$("$PY" "$REPO/jobs/sweep.py" --local --nodes 1 --ranks-per-node 2 --strategies ring,allgather \
  --seq 512 --ctxpar "$CTXPAR" --out "$WORK/sweep" -- "${SMALL[@]}")
[ "$(grep -c 'done before, kept' <<<"$out")" = 2 ] || fail "second call did not keep the 2 finished runs: $out"

# A train sweep of the four strategies on 4 ranks (--nodes 2 x 2: usp on ulysses:2,ring:2): one MFU
# peak for every run (measured once, recorded in sweep.json), so MFU is proportional to TFLOP/s
# across the sweep; the sweep ends with analysis.summary's table, a row per run, and the losses'
# agreement; the runs compute the same math, so their losses agree within the 2e-5 relative the
# tests hold strategies and meshes to (tests/README.md, "mesh invariance"; measured ~1e-7).
"$PY" "$REPO/jobs/sweep.py" --local --quiet --mode train --config "$REPO/inputs/tiny.toml" --nodes 2 \
  --ranks-per-node 2 --strategies allgather,ulysses,ring,usp --seq 512 --ctxpar "$CTXPAR" --out "$WORK/train" \
  -- steps=3 warmup=1 > "$WORK/train.out" || { cat "$WORK/train.out"; fail "train sweep failed"; }
cat "$WORK/train.out"
"$PY" "$REPO/analysis/summary.py" "$WORK/train" --csv > "$WORK/train.csv" || fail "analysis.summary DIR --csv failed"
(cd "$REPO" && "$PY" - "$WORK/train" "$WORK/train.out" "$WORK/train.csv") <<'PYEOF' || fail "train sweep: table, losses or MFU peak"
import csv, glob, json, sys
import numpy as np
from analysis import ctxpar_trace
d, out, csv_path = sys.argv[1:4]
strategies = ["allgather", "ulysses", "ring", "usp"]
names = [f"train-{s}-n2x2-s512" for s in strategies]
peak = [o for o in json.load(open(d + "/sweep.json"))["overrides"] if o.startswith("peak_tflops_per_rank=")]
assert len(peak) == 1, peak
want = float(peak[0].split("=")[1]) * 1e12
traces = [ctxpar_trace.load(f"{d}/{n}/trace.h5") for n in names]
got = [float(t.attrs["peak_flops_per_rank"]) for t in traces]
assert all(abs(g - want) <= 1e-9 * want for g in got), (want, got)
# The table the sweep printed: two header rows, then a row per run, in the sweep's order.
text = open(out).read().splitlines()
head = [i for i, l in enumerate(text) if l.startswith("# run ")]
assert len(head) == 1, text
rows = [l.split() for l in text[head[0] + 2:head[0] + 2 + len(names)]]
assert [r[0] for r in rows] == names, rows
assert all(r[-1] == "complete" for r in rows), rows
assert [l for l in text if "same model and data, 4 train runs" in l and "within the 2e-05" in l], text
# The CSV of the same table: the numbers of the traces.
with open(csv_path, newline="") as f:
    table = list(csv.DictReader(f))
assert [r["run"] for r in table] == names, table
meshes = {r["strategy"]: r["mesh"] for r in table}
assert meshes == {"allgather": "ring:4", "ulysses": "ulysses:4", "ring": "ring:4", "usp": "ulysses:2,ring:2"}, meshes
for r, t in zip(table, traces):
    m = t.measured_steps()
    assert r["status"] == "complete" and int(r["ranks"]) == 4 and int(r["seq"]) == 512, r
    assert int(r["steps"]) == 3 and int(r["warmup"]) == 1, r
    assert float(r["loss"]) == float(m["loss"][-1]), (r["loss"], m["loss"])
    assert abs(float(r["step_ms"]) - 1e3 * np.median(m["time_s"])) <= 1e-9 * float(r["step_ms"]), r
    assert abs(float(r["exposed_ms"]) - 1e3 * np.median(m["exposed_comm_s"])) <= 1e-9 * float(r["step_ms"]), r
    assert float(r["step_ms"]) > 0 and float(r["tokens_per_s"]) > 0 and float(r["tflops"]) > 0, r
    assert abs(float(r["peak_gflops"]) * 1e9 - want) <= 1e-9 * want and float(r["mfu_pct"]) > 0, r
    assert float(r["peak_mib"]) > 0, r
# Every step's loss: the same math on every strategy and mesh, within 2e-5 relative.
losses = np.array([t.steps["loss"] for t in traces], dtype=float)
assert losses.shape == (4, 4) and np.all(np.isfinite(losses)), losses
spread = float(np.max((losses.max(0) - losses.min(0)) / np.abs(losses).max(0)))
assert spread <= 2e-5, (spread, losses)
print(f"ok: 4 strategies, one table, losses agree to {spread:.1e}")
PYEOF

# heads=6 over kv_heads=4 (GQA groups not whole): ctxpar rejects it before running.
rc=0
"$PY" "$REPO/jobs/sweep.py" --local --quiet --nodes 1 --ranks-per-node 2 --strategies ring \
  --seq 1001 --ctxpar "$CTXPAR" --out "$WORK/bad" -- "${SMALL[@]}" heads=6 || rc=$?
[ $rc = 1 ] || fail "sweep with a rejected configuration returned $rc, expected 1"
bad=$WORK/bad/run-ring-n1x2-s1001
[ "$(cat "$bad/exit_code")" = 2 ] || fail "rejected run: exit_code $(cat "$bad/exit_code"), expected 2"
if [ -e "$bad/trace.h5" ] || [ -e "$bad/trace.h5.partial" ]; then fail "rejected run left a trace"; fi
grep -q "error" "$bad/job.out" || fail "rejected run: no error message in job.out"
"$PY" "$REPO/analysis/summary.py" "$WORK/bad" | grep -q "^  run-ring-n1x2-s1001 .*no trace (exit code 2" \
  || fail "analysis.summary: no row saying the rejected run left no trace"
echo "PASS: local sweep"
