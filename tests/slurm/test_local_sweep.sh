#!/usr/bin/env bash
# jobs/sweep.py --local: a 2-run sweep (ring, allgather on 2 ranks) through jobs/ctxpar.sbatch with
# mpirun; every run directory checked with the loader (tests/slurm/check_runs.py); a second call
# keeps the finished runs; a configuration ctxpar rejects fails its run (exit 2, nothing traced)
# and the sweep (exit 1).
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

# A train sweep: one MFU peak for every run (measured once, recorded in sweep.json), so MFU is
# proportional to TFLOP/s across the sweep.
"$PY" "$REPO/jobs/sweep.py" --local --quiet --mode train --config "$REPO/inputs/tiny.toml" --nodes 1 \
  --ranks-per-node 2 --strategies ring,allgather --seq 512 --ctxpar "$CTXPAR" --out "$WORK/train" -- steps=2 warmup=0
"$PY" - "$WORK/train" <<'PYEOF' || fail "train sweep: the runs do not share one recorded MFU peak"
import glob, json, sys
import h5py
d = sys.argv[1]
peak = [o for o in json.load(open(d + "/sweep.json"))["overrides"] if o.startswith("peak_tflops_per_rank=")]
assert len(peak) == 1, peak
want = float(peak[0].split("=")[1]) * 1e12
got = [float(h5py.File(t, "r").attrs["peak_flops_per_rank"]) for t in sorted(glob.glob(d + "/*/trace.h5"))]
assert len(got) == 2 and all(abs(g - want) <= 1e-9 * want for g in got), (want, got)
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
echo "PASS: local sweep"
