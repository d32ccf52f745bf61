#!/usr/bin/env bash
# Prepares the GPU device check (tests/gpu/device_check.sh) on a build machine that has nvcc, NCCL
# and every Debian dependency (this project's dev machines and CI): the GPU machine has CUDA and
# NCCL but no MPI, no HDF5, no network and no -dev packages, so everything is built here and
# carried there (docs/GPU.md, "Device check").
#
#   tests/gpu/prepare_device.sh [--jobs N] [--no-build] [--no-debs]
#
#  1. builds build-cuda (preset cuda-release; nice -n 19, -j2 unless --jobs) unless --no-build;
#  2. downloads into .debs/ the runtime Debian packages: the list of shared/DEVICE.md (OpenMPI with
#     its transport plugins, parallel HDF5) plus the package of every library in the ldd closure of
#     the carried binaries (BLIS, libgomp, libcurl's dependencies, ...), except glibc, libstdc++ and
#     libgcc, which the GPU machine has in newer versions; CUDA/NCCL libraries are not Debian's and
#     stay behind (the GPU machine has its own; device_check.sh finds them);
#  3. assembles .device/build-cuda/: ctxpar and the binaries of `ctest -L gpu`, stripped, with
#     gpu_tests.manifest, the tests' commands from `ctest --show-only=json-v1` with this machine's
#     paths replaced by placeholders (the repo's path and mpirun differ there).
# .debs/ and .device/ are listed in .git/info/exclude (never committed); the device tool carries
# them: carry [".debs", ".device"]. Prints their sizes: with the working tree they must stay under
# the device tool's 64 MiB.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
JOBS=2
BUILD=1
DEBS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-debs) DEBS=0; shift ;;
    -h|--help) sed -n 2,23p "$0"; exit 0 ;;
    *) echo "prepare_device.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
B=build-cuda
BUNDLE=.device/build-cuda

# Keep the carried folders out of git (idempotent).
for d in /.debs/ /.device/; do
  grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done

if [ "$BUILD" = 1 ]; then
  [ -f "$B/CMakeCache.txt" ] || nice -n 19 cmake --preset cuda-release
  nice -n 19 cmake --build "$B" -j "$JOBS"
fi
[ -x "$B/ctxpar" ] || { echo "prepare_device.sh: $B/ctxpar missing (build first)" >&2; exit 1; }

# ---- 3. bundle: binaries of ctest -L gpu + ctxpar, and the manifest ----
rm -rf .device && mkdir -p "$BUNDLE"
(cd "$B" && ctest -L '^gpu$' --show-only=json-v1) > .device/ctest_gpu.json
MPIEXEC=$(sed -n 's/^CTXPAR_MPIEXEC:FILEPATH=//p' "$B/CMakeCache.txt")
PYTHON=$(sed -n 's/^CTXPAR_PYTHON:FILEPATH=//p' "$B/CMakeCache.txt")
/usr/bin/python3 - "$ROOT" "$ROOT/$B" "$BUNDLE" "$MPIEXEC" "$PYTHON" <<'PY'
import json, os, shlex, shutil, sys
root, build, bundle, mpiexec, python = sys.argv[1:6]
tests = json.load(open(".device/ctest_gpu.json"))["tests"]
def rewrite(tok):
    # Files under the build dir are copied into the bundle; the source tree travels as the repo.
    if tok == mpiexec:
        return "@MPIEXEC@"
    if python and tok == python:
        return "@PYTHON@"
    if tok.startswith(build + "/"):
        rel = tok[len(build) + 1:]
        if os.path.isfile(tok):
            dst = os.path.join(bundle, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(tok, dst)
        return "@ROOT@/" + bundle + "/" + rel
    if tok == build:
        return "@ROOT@/" + bundle
    if tok.startswith(root + "/"):
        return "@ROOT@/" + tok[len(root) + 1:]
    return tok
lines = []
for t in tests:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    cmd = [rewrite(c) for c in t["command"]]
    env = [rewrite(e.split("=", 1)[0] + "=" + e.split("=", 1)[1]) if "=" in e else e for e in props.get("ENVIRONMENT", [])]
    skip = props.get("SKIP_REGULAR_EXPRESSION", [""])
    skip = skip[0] if isinstance(skip, list) and skip else (skip or "")
    wd = rewrite(props.get("WORKING_DIRECTORY", build))
    fields = [t["name"], str(int(float(props.get("TIMEOUT", 600)))), skip, wd, str(len(env))] + env + cmd
    lines.append(" ".join(shlex.quote(f) for f in fields))
open(os.path.join(bundle, "gpu_tests.manifest"), "w").write(
    "# name timeout_s skip_regex workdir n_env env... command... (tests/gpu/prepare_device.sh)\n" + "\n".join(lines) + "\n")
print(f"manifest: {len(lines)} tests of ctest -L '^gpu$'")
PY
cp "$B/ctxpar" "$BUNDLE/ctxpar"
# Provenance of the bundle, printed by device_check.sh (the GPU machine may have no .git).
{
  echo "built $(date -u +%FT%TZ) on $(hostname)"
  sed -n 's/^#define CTXPAR_GIT_\(SHA\|DIRTY\) /git_\L\1 /p' "$B/src/generated/core/git_version.hpp"
  echo "cuda_architectures $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$B/CMakeCache.txt")"
  echo "nvcc $(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' "$B"/CMakeFiles/*/CMakeCUDACompiler.cmake | head -1)"
} > "$BUNDLE/BUILD_INFO"
# Strip the copies (not the build): symbols are most of a test binary's size.
find "$BUNDLE" -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true

# ---- 2. runtime Debian packages ----
if [ "$DEBS" = 1 ]; then
  # shared/DEVICE.md's list: OpenMPI (+ its transport plugins' libraries) and parallel HDF5.
  pkgs=(openmpi-bin libopenmpi3 openmpi-common libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15
        libhdf5-openmpi-103-1 libsz2 libaec0 libcurl4 libfabric1 libucx0 libibverbs1 libnl-3-200 libnl-route-3-200
        libpsm2-2 libpsm-infinipath1 librdmacm1 libxnvctrl0 libnuma1 libltdl7 libgfortran5 libquadmath0)
  # Plus the owner of every library the carried binaries load.
  libs=$(find "$BUNDLE" -type f -perm -u+x -exec ldd {} \; 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
  for lib in $libs; do
    real=$(readlink -f "$lib")
    owner=""
    for p in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
      owner=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$owner" ] && break
    done
    case "$owner" in
      ""|libc6|libstdc++6|libgcc-s1) ;;  # not Debian's (CUDA, NCCL) or newer on the GPU machine
      *) pkgs+=("$owner") ;;
    esac
  done
  mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
  rm -rf .debs && mkdir -p .debs
  (cd .debs && apt-get download "${pkgs[@]}" >/dev/null)
  echo "debs: ${#pkgs[@]} packages: ${pkgs[*]}"
fi

echo "sizes (the device tool carries at most 64 MiB with the working tree):"
du -sh .debs .device 2>/dev/null || true
echo "not found in the bundle's ldd here (should be empty):"
find "$BUNDLE" -type f -perm -u+x -exec ldd {} \; 2>/dev/null | grep 'not found' | sort -u || true
echo "next, on the GPU machine: bash tests/gpu/device_check.sh   (device tool: carry [\".debs\", \".device\"])"
