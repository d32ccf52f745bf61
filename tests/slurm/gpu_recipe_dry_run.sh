#!/usr/bin/env bash
# shellcheck disable=SC2054  # commas inside one value (a mesh), not between array elements
# The GPU cluster recipe (jobs/ctxpar-gpu.sbatch; docs/GPU.md "On a GPU cluster") checked without a
# GPU and without SLURM:
#  1. the batch scripts parse; the wrapper asks for as many ranks as GPUs per node; run with a fake
#     SLURM environment and a fake srun (and mpirun) on PATH that record their arguments, it
#     launches build-cuda/ctxpar (a stand-in here) with device=cuda, `srun --mpi=pmix`,
#     SLURM_GPU_BIND=none and OMP_NUM_THREADS from --cpus-per-task, and leaves ctxpar.sbatch's run
#     directory (args, command, config.txt, job.out, exit_code); a sweep's run (no arguments) gets
#     device=cuda too; a device= on the command line is kept; fewer GPUs than ranks warns;
#     CTXPAR_LAUNCH=mpirun, and outside SLURM mpirun -np CTXPAR_NP; a missing binary: exit 2;
#  2. the docs' `ctxpar predict` sizing commands are accepted, price all four strategies, and say
#     they fit an 80 GB H100 (hardware=h100-ndr);
#  3. the docs' `--dry-run` sizing commands on ctxpar_emu (the CUDA build's program on an emulated
#     GPU, one per rank; the plan is the same code as build-cuda/ctxpar's), three of them through the
#     wrapper as `sbatch jobs/ctxpar-gpu.sbatch ... --dry-run` would run them (the fake srun starts
#     the ranks with mpirun): every plan's GPU memory per rank is at most 60 GiB (the docs' budget
#     for an 80 GB GPU), on 8, 16 and 32 ranks; and the counter-examples do not fit: llama3-8b
#     without tp, and each rank shown one GPU (8 ranks then counted on it). A subset of the docs'
#     table (one or two strategies per size; every row was run when the docs were written).
#     Skipped, with a note, where ctxpar_emu was not built (no nvcc/NCCL at configure time).
#
#   tests/slurm/gpu_recipe_dry_run.sh [CTXPAR] [WORKDIR]     (default build/ctxpar, a temporary dir)
#
# Needs bash, OpenMPI's mpirun (part 3) and an x86 CPU; about 25 s on 2 busy cores. Exit 0 pass, 1 fail.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
CTXPAR=$(realpath "${1:-$REPO/build/ctxpar}")
WORK=${2:-}
if [ -z "$WORK" ]; then WORK=$(mktemp -d /tmp/ctxpar-gpu-recipe.XXXXXX); trap 'rm -rf "$WORK"' EXIT; fi
rm -rf "$WORK"; mkdir -p "$WORK"; WORK=$(realpath "$WORK")
EMU=$(dirname "$CTXPAR")/ctxpar_emu
GPU_SCRIPT=$REPO/jobs/ctxpar-gpu.sbatch
BUDGET_GIB=60   # docs/GPU.md: the plan's GPU memory per rank we accept on an 80 GB GPU
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$CTXPAR" ] || fail "no executable $CTXPAR"

# Runs a command without the SLURM and CTXPAR variables of the caller's environment (a test run
# inside a SLURM job must not see that job's), with the fake launchers first on PATH.
clean_env=()
while IFS='=' read -r name _; do
  case "$name" in SLURM_* | SRUN_* | CTXPAR_* | NCCL_* | OMP_NUM_THREADS) clean_env+=(-u "$name") ;; esac
done < <(env)
BIN=$WORK/bin
run_clean() { env "${clean_env[@]}" PATH="$BIN:$PATH" FAKE_LOG="$WORK/launch.log" "$@"; }

# ---- 1. the scripts ---------------------------------------------------------------------------
for s in ctxpar-gpu.sbatch ctxpar.sbatch ctxpar-mpirun.sbatch; do bash -n "$REPO/jobs/$s" || fail "jobs/$s does not parse"; done
gpn=$(sed -n 's/^#SBATCH --gpus-per-node=\([0-9]*\)$/\1/p' "$GPU_SCRIPT")
tpn=$(sed -n 's/^#SBATCH --ntasks-per-node=\([0-9]*\)$/\1/p' "$GPU_SCRIPT")
{ [ -n "$gpn" ] && [ "$gpn" = "$tpn" ]; } || fail "ctxpar-gpu.sbatch: --gpus-per-node ($gpn) and --ntasks-per-node ($tpn) differ"

mkdir -p "$BIN"
# srun and mpirun stand-ins: record the call (arguments and the variables that matter), drop the
# launcher's own options, then run the program once; FAKE_RANKS_MPIRUN=1 runs it as
# SLURM_NTASKS ranks with the real mpirun, each shown every GPU of the node with --gpu-bind=none
# (SLURM's default), else one (CTXPAR_CUDA_MOCK_DEVICES is ctxpar_emu's GPU count).
for launcher in srun mpirun; do
  cat > "$BIN/$launcher" <<EOF
#!/usr/bin/env bash
{ printf '$launcher'; printf ' %q' "\$@"; echo " | SLURM_GPU_BIND=\${SLURM_GPU_BIND-} OMP_NUM_THREADS=\${OMP_NUM_THREADS-} NCCL_DEBUG=\${NCCL_DEBUG-}"; } >> "\$FAKE_LOG"
while [ \$# -gt 0 ]; do
  case "\$1" in -np | --bind-to | --map-by) shift 2 ;; -*) shift ;; *) break ;; esac
done
if [ "\${FAKE_RANKS_MPIRUN:-0}" = 1 ]; then
  gpus=\${SLURM_GPUS_ON_NODE:-1}; [ "\${SLURM_GPU_BIND:-}" = none ] || gpus=1
  exec env CTXPAR_CUDA_MOCK_DEVICES=\$gpus "$(command -v mpirun)" -np "\$SLURM_NTASKS" --oversubscribe --bind-to none "\$@" </dev/null
fi
exec "\$@"
EOF
  chmod +x "$BIN/$launcher"
done

# A repository whose build-cuda/ctxpar records how it was called (the scripts are the real ones).
FAKE=$WORK/repo
mkdir -p "$FAKE/jobs" "$FAKE/build-cuda"
for s in ctxpar-gpu.sbatch ctxpar.sbatch; do ln -s "$REPO/jobs/$s" "$FAKE/jobs/$s"; done
cat > "$FAKE/build-cuda/ctxpar" <<'EOF'
#!/usr/bin/env bash
printf '%q ' "$0" "$@" >> "$FAKE_LOG.ctxpar"; echo >> "$FAKE_LOG.ctxpar"
echo "stand-in ctxpar: $*"
EOF
chmod +x "$FAKE/build-cuda/ctxpar"
SUBMIT=$WORK/submit
mkdir -p "$SUBMIT"
slurm_env=(SLURM_JOB_ID=4242 SLURM_SUBMIT_DIR="$FAKE" SLURM_JOB_NODELIST='gpu[01-02]' SLURM_NTASKS=16
           SLURM_NTASKS_PER_NODE=8 SLURM_GPUS_ON_NODE=8 SLURM_CPUS_PER_TASK=8)

# A job as sbatch runs it: the script copied to SLURM's spool, run from the submit directory.
cp "$GPU_SCRIPT" "$WORK/spool-script"
(cd "$SUBMIT" && run_clean "${slurm_env[@]}" bash "$WORK/spool-script" \
   train --config inputs/llama3-8b.toml mesh=tp:4,ulysses:2,ring:2 strategy=usp seq=128K > "$WORK/job1.txt" 2>&1) \
  || { cat "$WORK/job1.txt"; fail "ctxpar-gpu.sbatch under the fake SLURM exited non-zero"; }
RD=$SUBMIT/runs/4242
for f in args command config.txt job.out exit_code; do [ -f "$RD/$f" ] || fail "no $RD/$f"; done
[ "$(cat "$RD/exit_code")" = 0 ] || fail "exit_code $(cat "$RD/exit_code")"
[ "$(tail -n 1 "$RD/args")" = device=cuda ] || fail "args does not end with device=cuda: $(cat "$RD/args")"
[ "$(grep -c '^srun ' "$WORK/launch.log")" = 2 ] || fail "expected 2 srun calls (--print-config, run): $(cat "$WORK/launch.log")"
while read -r line; do
  for want in "srun --mpi=pmix " "$FAKE/build-cuda/ctxpar " " device=cuda" "SLURM_GPU_BIND=none " "OMP_NUM_THREADS=8 " "NCCL_DEBUG=WARN"; do
    [[ "$line" == *"$want"* ]] || fail "srun call lacks '$want': $line"
  done
done < "$WORK/launch.log"
grep -q -- '--print-config' "$WORK/launch.log.ctxpar" || fail "no --print-config run"
grep -q "out=runs/4242/trace.h5" "$WORK/launch.log.ctxpar" || fail "the run does not write runs/4242/trace.h5: $(cat "$WORK/launch.log.ctxpar")"
grep -q "^# ctxpar exit code 0" "$RD/job.out" || fail "job.out: no exit line"

# A sweep's run (no arguments: the run directory's args file) gets device=cuda; a named device is kept.
rm -f "$WORK"/launch.log*
mkdir -p "$WORK/sweep/run1"
printf '%s\n' train --config inputs/tiny.toml strategy=ring > "$WORK/sweep/run1/args"
(cd "$SUBMIT" && run_clean "${slurm_env[@]}" CTXPAR_RUN_DIR="$WORK/sweep/run1" bash "$GPU_SCRIPT" > "$WORK/job2.txt" 2>&1) \
  || { cat "$WORK/job2.txt"; fail "sweep run failed"; }
[ "$(tail -n 1 "$WORK/sweep/run1/args")" = device=cuda ] || fail "sweep run: args without device=cuda: $(cat "$WORK/sweep/run1/args")"
grep -q " device=cuda " "$WORK/launch.log" || fail "sweep run launched without device=cuda"
(cd "$SUBMIT" && run_clean "${slurm_env[@]}" CTXPAR_RUN_DIR="$WORK/cpu" bash "$GPU_SCRIPT" run device=cpu > /dev/null 2>&1) \
  || fail "run with device=cpu failed"
[ "$(grep -c device= "$WORK/cpu/args")" = 1 ] || fail "device=cpu was not kept alone: $(cat "$WORK/cpu/args")"

# Fewer GPUs than ranks: a warning; mpirun inside the allocation; a missing binary: exit 2.
out=$(cd "$SUBMIT" && run_clean "${slurm_env[@]/SLURM_GPUS_ON_NODE=8/SLURM_GPUS_ON_NODE=4}" CTXPAR_RUN_DIR="$WORK/share" \
      bash "$GPU_SCRIPT" run 2>&1) || fail "shared-GPU run failed: $out"
grep -q "warning: 8 ranks per node on 4 GPUs" <<<"$out" || fail "no warning for 8 ranks on 4 GPUs: $out"
rm -f "$WORK"/launch.log*
(cd "$SUBMIT" && run_clean "${slurm_env[@]}" CTXPAR_LAUNCH=mpirun CTXPAR_RUN_DIR="$WORK/mpirun" bash "$GPU_SCRIPT" run > /dev/null 2>&1) \
  || fail "CTXPAR_LAUNCH=mpirun run failed"
grep -q "^mpirun --bind-to none .*build-cuda/ctxpar run device=cuda .*SLURM_GPU_BIND=none" "$WORK/launch.log" \
  || fail "CTXPAR_LAUNCH=mpirun: $(cat "$WORK/launch.log")"
# Outside SLURM (one GPU machine): mpirun -np CTXPAR_NP, the same run directory.
rm -f "$WORK"/launch.log*
(cd "$SUBMIT" && run_clean CTXPAR_REPO="$FAKE" CTXPAR_NP=8 CTXPAR_RUN_DIR="$WORK/local" bash "$GPU_SCRIPT" run > /dev/null 2>&1) \
  || fail "run outside SLURM failed"
grep -q "^mpirun -np 8 --oversubscribe --bind-to none .*build-cuda/ctxpar run device=cuda " "$WORK/launch.log" \
  || fail "outside SLURM: $(cat "$WORK/launch.log")"
[ "$(cat "$WORK/local/exit_code")" = 0 ] || fail "outside SLURM: no exit_code 0"
rc=0
out=$(cd "$SUBMIT" && run_clean "${slurm_env[@]}" CTXPAR_BIN="$WORK/nothing" bash "$GPU_SCRIPT" run 2>&1) || rc=$?
{ [ $rc = 2 ] && grep -q "cmake --preset cuda-release" <<<"$out"; } || fail "missing binary: exit $rc, $out"
echo "ok 1: jobs/ctxpar-gpu.sbatch launches build-cuda/ctxpar with device=cuda, one rank per GPU"

# ---- 2. predict: the docs' sizing commands ------------------------------------------------------
predict() {  # predict NAME MESH SEQ: the docs' command; every strategy's row must say it fits
  local out
  out=$("$CTXPAR" predict --config "$REPO/inputs/llama3-8b.toml" hardware=h100-ndr predict_mesh="$2" seq="$3" \
        remat=full out="$WORK/predict-$1.h5" 2>&1) || fail "predict $2 $3: $out"
  for s in allgather ulysses ring usp; do
    grep -Eq "^ *train +h100-ndr .* $s .* yes( |$)" <<<"$out" || fail "predict $2 $3: no row for $s that fits:"$'\n'"$out"
  done
  grep -q "^# recommended: " <<<"$out" || fail "predict $2 $3: no recommendation"
}
predict n1 tp:4,ulysses:2 32K
predict n1-64k tp:4,ulysses:2 64K
predict n2 tp:4,ulysses:2,ring:2 128K
predict n4 tp:4,ulysses:2,ring:4 256K
out=$("$CTXPAR" predict --config "$REPO/inputs/llama3-8b.toml" hardware=h100-ndr predict_mesh=ring:8 seq=32K \
      out="$WORK/predict-ring8.h5" 2>&1) || fail "predict ring:8: $out"
grep -Eq "^ *train +h100-ndr .* ring .* no( |$)" <<<"$out" || fail "predict ring:8 32K (no tp) should not fit 80 GB:"$'\n'"$out"
echo "ok 2: predict prices the docs' meshes (h100-ndr), all four strategies fit its 80 GB"

# ---- 3. --dry-run through the wrapper on the emulated GPU -----------------------------------------
if [ ! -x "$EMU" ]; then
  echo "ok 3: SKIPPED: no $EMU (a build without nvcc and NCCL has no ctxpar_emu): GPU memory plans not checked"
  echo "PASS: GPU recipe (parts 1 and 2)"
  exit 0
fi
n=0
# check_plan OUT RANKS EXPECT WHAT: the plan's "GPU memory check" line; EXPECT fits (and within the
# budget) or exceeds (over the budget, or refused).
check_plan() {
  local out=$1 ranks=$2 expect=$3 what=$4 line gib
  line=$(grep '^GPU memory check: ' "$out") || { cat "$out"; fail "dry run $what: no GPU memory check"; }
  gib=$(sed -n 's/^GPU memory check: \([0-9.]*\) GiB per rank.*/\1/p' <<<"$line")
  if [ "$expect" = fits ]; then
    [[ "$line" == *": fits" ]] || fail "dry run $what on $ranks ranks: $line"
    awk -v g="$gib" -v b="$BUDGET_GIB" 'BEGIN { exit !(g + 0 > 0 && g + 0 <= b) }' \
      || fail "dry run $what on $ranks ranks: $gib GiB per rank, over the ${BUDGET_GIB} GiB budget"
    printf '  %2d ranks  %-72s %6s GiB per rank\n' "$ranks" "$what" "$gib"
  else
    awk -v g="$gib" -v b="$BUDGET_GIB" 'BEGIN { exit !(g + 0 > b) }' || [[ "$line" == *"does NOT fit"* ]] \
      || fail "dry run $what on $ranks ranks should not fit: $line"
    printf '  %2d ranks  %-72s %6s GiB per rank: does not fit, as expected\n' "$ranks" "$what" "$gib"
  fi
}
# The cluster form: sbatch jobs/ctxpar-gpu.sbatch train ... --dry-run (srun faked by mpirun here).
via_script() {  # via_script RANKS EXPECT ARGS...
  local ranks=$1 expect=$2; shift 2
  n=$((n + 1))
  local rd=$WORK/dry$n env=("${slurm_env[@]/SLURM_NTASKS=16/SLURM_NTASKS=$ranks}")
  env=("${env[@]/SLURM_CPUS_PER_TASK=8/SLURM_CPUS_PER_TASK=1}")
  (cd "$REPO" && run_clean "${env[@]}" SLURM_NTASKS_PER_NODE="$ranks" SLURM_GPUS_ON_NODE="$ranks" FAKE_RANKS_MPIRUN=1 \
     CTXPAR_REPO="$REPO" CTXPAR_BIN="$EMU" CTXPAR_RUN_DIR="$rd" ${GPU_BIND:+CTXPAR_GPU_BIND=$GPU_BIND} \
     bash "$GPU_SCRIPT" train --config inputs/llama3-8b.toml "$@" --dry-run > "$rd.txt" 2>&1) \
    || { cat "$rd.txt"; fail "dry run $* on $ranks ranks: exit code $(cat "$rd/exit_code" 2>/dev/null)"; }
  [ "$(tail -n 1 "$rd/args")" = device=cuda ] || fail "dry run $*: args without device=cuda"
  check_plan "$rd/job.out" "$ranks" "$expect" "sbatch: $*"
}
# The form docs/GPU.md shows for a machine without a GPU (all ranks on one host, a GPU each).
direct() {  # direct RANKS EXPECT ARGS...
  local ranks=$1 expect=$2; shift 2
  n=$((n + 1))
  (cd "$REPO" && env CTXPAR_CUDA_MOCK_DEVICES="${MOCK_GPUS:-$ranks}" OMP_NUM_THREADS=1 mpirun -np "$ranks" --oversubscribe \
     --bind-to none "$EMU" train --config inputs/llama3-8b.toml device=cuda "$@" --dry-run out="$WORK/dry$n.h5" \
     > "$WORK/dry$n.txt" 2>&1 </dev/null) || { cat "$WORK/dry$n.txt"; fail "dry run $* on $ranks ranks"; }
  check_plan "$WORK/dry$n.txt" "$ranks" "$expect" "$*"
}
L1=(mesh=tp:4,ulysses:2 seq=32K remat=full)
L1B=(mesh=tp:4,ulysses:2 seq=64K remat=full offload=optimizer)
L2=(mesh=tp:4,ulysses:2,ring:2 seq=128K remat=full offload=optimizer)
L4=(mesh=tp:4,ulysses:2,ring:4 seq=256K remat=full offload=optimizer)
via_script 8 fits "${L1[@]}" strategy=ring
via_script 16 fits "${L2[@]}" strategy=usp
via_script 32 fits "${L4[@]}" strategy=usp
direct 8 fits "${L1[@]}" strategy=allgather
direct 8 fits "${L1B[@]}" strategy=ring
direct 16 fits "${L2[@]}" strategy=allgather
# Counter-examples: no tp (the whole model's state on every GPU); each rank shown one GPU of the
# node (what --gpu-bind=single:1 or --gpus-per-task=1 give): 8 ranks counted on one GPU.
direct 8 exceeds mesh=ring:8 seq=32K
MOCK_GPUS=1 direct 8 exceeds "${L1[@]}" strategy=ring
grep -q "8 rank(s) on it" "$WORK/dry$n.txt" || fail "one GPU shown per rank: the plan does not count 8 ranks on it"
echo "ok 3: the docs' --dry-run plans fit ${BUDGET_GIB} GiB per GPU; no tp, or one GPU shown per rank, does not"
echo "PASS: GPU recipe"
