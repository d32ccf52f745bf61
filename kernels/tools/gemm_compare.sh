#!/usr/bin/env bash
# Runs the GEMM library comparison (kernels/tools/gemm_compare.cpp) for every library this
# machine has and prints one markdown table: GFLOP/s (median of 7) per model shape, library
# and thread count, the best per row marked, '!' after a rate whose result failed its check.
#   bash kernels/tools/gemm_compare.sh [BUILD=build] [tokens-per-rank=4096] [threads...]
# Needs libblis-openmp-dev, libopenblas-pthread-dev, libdnnl-dev (Debian); a missing one is left out.
set -euo pipefail
BUILD=${1:-build}
TOKENS=${2:-4096}
shift $(( $# > 2 ? 2 : $# )) || true
THREADS=("$@")
[ ${#THREADS[@]} -gt 0 ] || THREADS=(1 "$(nproc)")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
own=1
# BLIS twice where the CPU has AVX-512: with the kernels BLIS picks itself and with skx (BLIS
# 0.9 picks by the brand string on Intel and may run its AVX2 kernels on an AVX-512 machine).
runs=(blis)
grep -qw avx512f /proc/cpuinfo && runs+=(blis:skx)
runs+=(openblas dnnl)
for run in "${runs[@]}"; do
  lib=${run%%:*}
  arch=${run#*:}; [ "$arch" = "$run" ] && arch=''
  # (BLIS 0.9 reads BLIS_ARCH_TYPE as an index into its configurations: 0 = skx)
  [ "$arch" = skx ] && arch_env=(env BLIS_ARCH_TYPE=0) || arch_env=(env)
  if ! cmake --build "$BUILD" --target "ctxpar_gemm_compare_$lib" >"$out/build_$lib.log" 2>&1; then
    echo "# $lib: not built (library missing?), left out" >&2
    continue
  fi
  # The own kernel's rows once (with the first library).
  GEMM_COMPARE_OWN=$own "${arch_env[@]}" "$BUILD/kernels/ctxpar_gemm_compare_$lib" "$TOKENS" "${THREADS[@]}" \
    >"$out/${lib}${arch}.csv"
  own=0
  grep '^#' "$out/${lib}${arch}.csv" >&2
done
/usr/bin/python3 - "$out" <<'PY'
import csv, glob, os, sys
rows = {}
libs = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.csv"))):
    for r in csv.DictReader(l for l in open(f) if not l.startswith("#")):
        key = (r["shape"], r["op"], r["M"], r["N"], r["K"], int(r["threads"]))
        rows.setdefault(key, {})[r["lib"]] = (float(r["gflops_median"]), r["ok"] == "1")
        if r["lib"] not in libs:
            libs.append(r["lib"])
libs.sort(key=lambda l: (["blis", "openblas", "onednn", "own"].index(l.split("-")[0]), l))
print("| shape | op | M x N x K | threads | " + " | ".join(libs) + " | best |")
print("|---|---|---|---|" + "---|" * (len(libs) + 1))
for key in sorted(rows, key=lambda k: (k[5], list(rows).index(k))):
    shape, op, M, N, K, t = key
    res = rows[key]
    best = max((v[0], l) for l, v in res.items() if v[1]) if any(v[1] for v in res.values()) else (0, "none")
    cells = []
    for l in libs:
        if l not in res:
            cells.append("—")
            continue
        g, ok = res[l]
        c = f"{g:.1f}" + ("" if ok else " !")
        cells.append(f"**{c}**" if l == best[1] else c)
    print(f"| {shape} | {op} | {M} x {N} x {K} | {t} | " + " | ".join(cells) + f" | {best[1]} |")
PY
