#!/usr/bin/env bash
# Installs the Debian 12 packages ctxpar needs, only those missing. Run as root (or via sudo).
# Called by the Makefile when a dependency is missing and by .ci/run; safe to run twice.
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev            # MPI (OpenMPI 4.1)
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5 for traces and checkpoints
  libgtest-dev libgmock-dev             # GoogleTest
  libtoml11-dev                         # TOML configuration
  libblis-openmp-dev                    # GEMM library (the default: kernels/README.md)
  libdnnl-dev                           # GEMM library option CTXPAR_BLAS=onednn, and the comparison tool
  python3-h5py python3-numpy python3-matplotlib   # analysis/
  python3-torch                         # tests/oracle (PyTorch autograd reference)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
