#!/usr/bin/env bash
# Installs what dpe needs on a Debian 12 machine. Idempotent: when everything is present it only checks
# (well under a second); otherwise it runs `apt-get update` once and installs the missing packages.
set -euo pipefail

packages=(
  bazel-bootstrap        # Bazel 4.2.3, offline-capable (see docs/BUILD_OFFLINE.md)
  bazel-platforms        # @platforms, as a local repository
  g++
  python3                # tools/test_summary.py
  pkgconf                # pkg-config: tools/embedding_test.sh compiles against an install of dpe
  libgtest-dev
  libbenchmark-dev
  libtbb-dev             # oneTBB: intra-op parallelism
  libdnnl-dev            # oneDNN: float32 GEMM (and later convolution) on CPU
  libopenblas-dev        # OpenBLAS: float64 GEMM for gradient checks
  zlib1g-dev             # zlib: the gzip-compressed Fashion-MNIST files (data/idx_reader.cc)
  libcli11-dev           # CLI11: the dpe tool's command line
  nlohmann-json3-dev     # nlohmann-json: safetensors checkpoint headers, the dpe tool's --json reports
  libsentencepiece-dev   # SentencePiece 0.1.97: the subword tokenizer of data/tokenizer.h and dpe tokenize
  libsentencepiece0      # its shared libraries (libsentencepiece, libsentencepiece_train), which dpe links
  openmpi-bin            # Open MPI: mpirun, and the cross-process collectives (collectives/mpi_world.h)
  libopenmpi-dev
  iproute2               # ip netns: the two-host test's network namespaces (tools/dpe/dpe_two_hosts_test.sh)
  gnuplot-nox            # dpe bench --png
  dataset-fashion-mnist  # the default real data set
  fortunes-min           # a small text corpus for the tiny-llama example (data/text_corpus.h)
  fortunes               # the full fortune database, 2.5 MB of English text: a corpus for dpe tokenize (docs/DATA.md)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} > 0)); then
  echo "dpe setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "dpe setup: CUDA toolkit found at /usr/local/cuda: the CUDA backend will be built"
else
  echo "dpe setup: no CUDA toolkit at /usr/local/cuda: CPU-only build"
fi
