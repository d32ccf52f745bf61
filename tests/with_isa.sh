#!/bin/sh
# with_isa.sh ISA COMMAND [ARGS...]: runs COMMAND with CTXPAR_ISA=ISA (scalar, avx2 or avx512: the CPU
# kernels' tiles and the GEMM library's kernel family, kernels/ops.hpp), or exits 77 (ctest:
# skipped) where this CPU lacks ISA. tests/CMakeLists.txt runs the numerics-sensitive tests so
# under each, so that a tolerance that holds on one CPU family only fails on every machine.
isa=$1
shift
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() {
  for f in "$@"; do
    case " $flags " in *" $f "*) ;; *) return 1 ;; esac
  done
}
case $isa in
  scalar) ;;
  avx2) has avx2 fma || { echo "with_isa.sh: skipped, this CPU has no AVX2+FMA"; exit 77; } ;;
  avx512) has avx2 fma avx512f avx512dq avx512bw avx512vl ||
            { echo "with_isa.sh: skipped, this CPU has no AVX-512 F/DQ/BW/VL"; exit 77; } ;;
  *) echo "with_isa.sh: unknown ISA '$isa' (scalar, avx2, avx512)"; exit 2 ;;
esac
CTXPAR_ISA=$isa exec "$@"
