#!/usr/bin/env bash
# Install everything Gale needs to build, test and benchmark, from Debian 12 packages only.
# Usage: scripts/install-deps.sh [--bench]   (--bench adds PyTorch/numpy for the baselines)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev            # GEMM (oneDNN), shares OpenMP with Gale
  ocl-icd-opencl-dev     # only a Recommends of libdnnl-dev, but its CMake config does find_package(OpenCL REQUIRED)
  libopenmpi-dev openmpi-bin  # collectives for multi-process training
  libsentencepiece-dev sentencepiece  # SentencePiece tokenizers; spm_train for the demo tokenizer
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  libyaml-cpp-dev        # Megatron's --yaml-cfg argument files
  libzstd-dev            # zstd: the lossless codec of --compress-optimizer/--compress-activation/--compress-dense
  libisal-dev            # CRC-32C (crc32_iscsi) of TensorBoard event files (--tensorboard-dir)
  libicu-dev             # Unicode normalisation for Hugging Face tokenizer.json normalizers
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev libomp-dev  # libFuzzer targets (scripts/fuzz.sh, run by scripts/test.sh)
  python3
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch python3-numpy libopenblas-dev libblis-dev hyperfine)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#packages[@]} packages present"
