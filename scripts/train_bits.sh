#!/bin/bash
# scripts/train_bits.sh BIN OUTDIR: 13 `ctxpar train` configurations run by binary BIN (from the
# repository root), each writing a checkpoint (weights, both AdamW moments) to OUTDIR, and
# OUTDIR/hashes.txt: one SHA-256 over every dataset of each. Two builds give the same bits when
# their hashes.txt are equal (a refactoring that must not change any result; docs/measurements.md).
# The step table (step, loss, grad_norm) of each run is in OUTDIR/run_N.txt.
[ $# -eq 2 ] || { echo "usage: scripts/train_bits.sh BIN OUTDIR" >&2; exit 2; }
BIN=$(realpath "$1"); OUT=$(realpath -m "$2"); mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
cd "$(dirname "$0")/.."
DET="deterministic=true seq=200 steps=2"
MLA="attention=mla q_lora_rank=24 kv_lora_rank=32 qk_nope_head_dim=16 qk_rope_head_dim=8 v_head_dim=16"
i=0
while IFS='|' read -r np args; do
  i=$((i+1))
  mpirun --oversubscribe -np $np $BIN train --config inputs/default.toml out=$OUT/trace_$i.h5 checkpoint=$OUT/ck_$i.h5 checkpoint_every=2 $args < /dev/null > $OUT/raw_$i.txt 2>&1
  echo "rc=$? np=$np $args" > $OUT/run_$i.txt
  grep -E "^ +[0-9]+ " $OUT/raw_$i.txt | awk '{print $1, $2, $3}' >> $OUT/run_$i.txt
done <<LIST
4|
4|$DET
1|$DET
4|$DET mesh=tp:2,ring:2 strategy=ring
2|$DET $MLA mesh=tp:2
2|$DET $MLA strategy=ring
2|$DET layer_pattern=DG seq=512 deterministic_block=128 strategy=ring
3|$DET layer_pattern=GL window=24 strategy=allgather
4|$DET kv_heads=4 mesh=tp:2,ulysses:2 strategy=ulysses
2|$MLA strategy=ring
2|layer_pattern=DG strategy=ring
4|kv_heads=4 mesh=tp:4
2|steps=3 mesh=tp:2
LIST
/usr/bin/python3 - $OUT <<'PY'
import h5py, hashlib, sys, glob, os
out = sys.argv[1]
with open(os.path.join(out, "hashes.txt"), "w") as f:
    for ck in sorted(glob.glob(os.path.join(out, "ck_*.h5"))):
        h = hashlib.sha256()
        with h5py.File(ck, "r") as x:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    h.update(name.encode()); h.update(obj[()].tobytes())
            x.visititems(visit)
        f.write(f"{os.path.basename(ck)} {h.hexdigest()}\n")
PY
