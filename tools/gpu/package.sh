#!/usr/bin/env bash
# Packages the CUDA build of every test and benchmark into one folder that runs on a bare GPU machine:
#
#   tools/gpu/package.sh [OUT_DIR] [--no-compress] [-- BAZEL_BUILD_ARGS...]   (OUT_DIR defaults to gpu_bundle/)
#
# then, on the GPU machine, from a copy of the repo that carries OUT_DIR:  bash gpu_bundle/run_suite.sh "$OUT"
# (docs/GPU.md). OUT_DIR holds run_suite.sh, MANIFEST.txt and payload.tar.xz, which run_suite.sh unpacks
# (--no-compress: the tree itself instead of payload.tar.xz). The tree:
#   bin/tests/   every cc_test binary, named <package>.<target> (core.conv_test, layers.conv_test, ...)
#   bin/tools/   every other cc_binary (examples, the dpe tools); bin/bench/: the cc_binaries of //bench
#   bin/sh/      the sh_test scripts; tests.tsv lists every test and its command line
#   runfiles/    the data files the tests read (golden fixtures, testdata), laid out as in Bazel's runfiles
#                tree; the tests run with it as working directory, as under `bazel test`
#   lib/         every shared library the binaries load that a machine with only the NVIDIA driver, the CUDA
#                toolkit and PyTorch's CUDA wheels may lack: dpe's own (Bazel links tests against _solib
#                shared libraries), oneTBB, oneDNN, OpenBLAS, libgomp, libgfortran, ... Not the driver
#                (libcuda) and not the CUDA libraries (cudart, cuBLAS/cuBLASLt, cuDNN, NCCL: over 1 GiB, and
#                the GPU image has them, see docs/GPU.md); run_suite.sh finds those there.
#   lib/compat/  Debian 12's libstdc++/libgcc_s, used by run_suite.sh only if the machine's are too old
#   sysdata/     files of the Debian packages the tests read by absolute path (Fashion-MNIST, fortunes, Open MPI),
#                which run_suite.sh copies to / where missing; a .gz file is stored decompressed (NAME.gz.gunzipped)
#                and gzipped back there
#   MANIFEST.txt what was built from which commit, with which toolkit, and the CUDA sonames expected there
# Binaries and dpe's libraries lose their debug info (strip --strip-debug), not their symbols.
# Idempotent: the tree is built in a temporary folder and replaces OUT_DIR (only an empty folder or an
# earlier bundle, marked by .dpe_gpu_bundle) at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

out="gpu_bundle"
compress=1
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --no-compress) compress=0 ;;
    -*) echo "package: unknown option $1" >&2; exit 2 ;;
    *) out="$1" ;;
  esac
  shift
done
[[ $# -gt 0 && "$1" == "--" ]] && shift
bazel_args=("$@")
case "$out" in /*) ;; *) out="$repo/$out" ;; esac

log() { echo "package: $*"; }
human() { numfmt --to=iec-i --suffix=B "$1"; }

if [[ ! -x /usr/local/cuda/bin/nvcc && -z "${DPE_CUDA_PATH:-}" ]]; then
  echo "package: no CUDA toolkit at /usr/local/cuda (nor \$DPE_CUDA_PATH): the build would be CPU-only." >&2
  echo "package: a GPU bundle needs the CUDA configuration; install the toolkit first." >&2
  exit 1
fi

tools/setup.sh

log "bazel build //... ${bazel_args[*]:-}"
bazel build //... "${bazel_args[@]}"

# With the build's own options: bazel-bin differs per configuration (--config=cpu_only has its own).
bin_dir=$(bazel info "${bazel_args[@]}" bazel-bin 2>/dev/null)
exec_root=$(bazel info "${bazel_args[@]}" execution_root 2>/dev/null)
cuda_defs="$(bazel info "${bazel_args[@]}" output_base 2>/dev/null)/external/local_cuda/defs.bzl"
if ! grep -q "HAS_CUDA = True" "$cuda_defs"; then
  echo "package: $cuda_defs says HAS_CUDA is not True: this build has no CUDA backend; refusing to package." >&2
  exit 1
fi
workspace=$(sed -n 's/^workspace(name = "\([^"]*\)").*/\1/p' WORKSPACE)

# --- the tree, built in a staging folder ---------------------------------------------------------------------
# OUT_DIR is replaced only at the end, and only if it is empty or an earlier bundle (it holds .dpe_gpu_bundle).
if [[ -e "$out" && ! -f "$out/.dpe_gpu_bundle" ]] && [[ ! -d "$out" || -n "$(ls -A "$out")" ]]; then
  echo "package: $out exists and is not a dpe GPU bundle; not touching it." >&2
  exit 1
fi
stage=$(mktemp -d "${TMPDIR:-/tmp}/dpe_gpu_bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin/tests,bin/tools,bin/bench,bin/sh,runfiles,lib/compat}
touch "$stage/.dpe_gpu_bundle"

# Label //a/b:name -> bundle name a.b.name (test names repeat across packages: core:conv_test, layers:conv_test).
flat() { local l="${1#//}"; l="${l/:/.}"; echo "${l//\//.}"; }
# Label -> its output file under bazel-bin.
output_of() { local l="${1#//}"; echo "$bin_dir/${l%%:*}/${l#*:}"; }

copy_binary() {  # copy_binary LABEL DEST_DIR -> sets $path to the bundle-relative path
  local src dest
  src=$(output_of "$1")
  dest="$2/$(flat "$1")"
  [[ -f "$src" ]] || { echo "package: WARNING: $1 has no output at $src (not built?); skipped" >&2; return 1; }
  # Debug info (-g1) is most of each binary; symbols stay, so backtraces still name functions.
  strip --strip-debug -o "$dest" "$src"
  chmod 755 "$dest"
  originals+=("$src")  # ldd runs on these: their RUNPATH ($ORIGIN/../_solib_k8/...) finds dpe's own libraries
  path="${dest#"$stage"/}"
}

copy_runfiles_data() {  # data files from a target's runfiles tree, merged into runfiles/ (same relative paths)
  local tree
  tree="$(output_of "$1").runfiles/$workspace"
  [[ -d "$tree" ]] || return 0
  local self="${1#//}"
  self="${self/://}"  # the target's own executable, e.g. examples/core_smoke_test
  self="${self#/}"    # //:name
  (cd "$tree" && find -L . -type f ! -path './_solib*' ! -path './external/*' ! -path "./$self" -print0) |
    while IFS= read -r -d '' f; do
      f="${f#./}"
      # Executables (the test itself, binaries an sh_test runs) are packaged as binaries, not as data.
      if head -c 4 "$tree/$f" | grep -q $'^\x7fELF'; then continue; fi
      case "$f" in *.sh) continue ;; esac
      mkdir -p "$stage/runfiles/$(dirname "$f")"
      cp -L "$tree/$f" "$stage/runfiles/$f"
    done
}

tests_tsv="$stage/tests.tsv"
: >"$tests_tsv"
declare -A bundled  # label -> bundle path, for sh_test arguments
originals=()

# test_args LABEL BUILD: the test's `args`, each after a tab, each $(location REF) resolved: a bundled binary to
# its bundle path, a file to its path under the runfiles root (the tests' working directory on the GPU
# machine). Fails for a reference that is neither.
test_args() {
  local label="$1" build="$2" pkg line="" a ref
  local -a args
  pkg="${label#//}"; pkg="${pkg%%:*}"
  mapfile -t args < <(python3 - "$build" <<'EOF'
import re, sys
m = re.search(r'args = \[([^\]]*)\]', sys.argv[1])
for a in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1) if m else ""):
    print(a)
EOF
)
  for a in "${args[@]}"; do
    # Every $(location REF) in the argument, whole (a binary) or inside it (--dict=$(location x.dict)).
    while [[ "$a" =~ ^(.*)\$\(location\ ([^\)]+)\)(.*)$ ]]; do
      local before="${BASH_REMATCH[1]}" after="${BASH_REMATCH[3]}" path
      ref="${BASH_REMATCH[2]}"
      [[ "$ref" == //* ]] || ref="//$pkg:${ref#:}"
      if [[ -n "${bundled[$ref]:-}" ]]; then
        path="${bundled[$ref]}"
      elif [[ -f "$(tr : / <<<"${ref#//}")" ]]; then
        path=$(tr : / <<<"${ref#//}")  # //fuzz:dicts/idx.dict -> fuzz/dicts/idx.dict
      else
        log "WARNING: $label: $ref is neither bundled nor a file; skipped"; return 1
      fi
      a="$before$path$after"
    done
    line+=$'\t'"$a"
  done
  printf '%s' "$line"
}

# Manual tests (run by name by another script, e.g. tools/tsan_test.sh) are not built by `bazel build //...`.
# Left out: tests tagged manual, and targets tagged not_in_gpu_bundle (run_suite.sh's own test and its fixture).
left_out='attr("tags", "manual", //...) + attr("tags", "not_in_gpu_bundle", //...)'
mapfile -t cc_tests < <(bazel query "kind(cc_test, //...) except ($left_out)" 2>/dev/null | sort)
mapfile -t cc_bins < <(bazel query "kind(cc_binary, //...) except ($left_out)" 2>/dev/null | sort)
mapfile -t sh_tests < <(bazel query "kind(sh_test, //...) except ($left_out)" 2>/dev/null | sort)

# The fuzz harnesses are cc_tests but not GoogleTest binaries: kind "exe", judged by exit status, with their args.
mapfile -t fuzz_tests < <(bazel query 'attr(generator_function, dpe_fuzz_test, //...)' 2>/dev/null | sort)
for label in "${cc_tests[@]}"; do
  copy_binary "$label" "$stage/bin/tests" || continue
  bundled[$label]=$path
  copy_runfiles_data "$label"
  if [[ " ${fuzz_tests[*]} " == *" $label "* ]]; then
    extra=$(test_args "$label" "$(bazel query --output=build "$label" 2>/dev/null)") || continue
    printf '%s\texe\t%s%s\n' "$(flat "$label")" "$path" "$extra" >>"$tests_tsv"
  else
    printf '%s\tgtest\t%s\n' "$(flat "$label")" "$path" >>"$tests_tsv"
  fi
done
log "${#cc_tests[@]} cc_test binaries -> bin/tests/"

n_bench=0
for label in "${cc_bins[@]}"; do
  case "$label" in //bench:* | //bench/*) dir=bench; n_bench=$((n_bench + 1)) ;; *) dir=tools ;; esac
  copy_binary "$label" "$stage/bin/$dir" || continue
  bundled[$label]=$path
  copy_runfiles_data "$label"
done
log "${#cc_bins[@]} cc_binary targets -> bin/tools/, bin/bench/ ($n_bench benchmarks)"

# sh_tests: the script and its args, with $(location LABEL) resolved to the bundled binary.
for label in "${sh_tests[@]}"; do
  pkg="${label#//}"; pkg="${pkg%%:*}"
  build=$(bazel query --output=build "$label" 2>/dev/null)
  src=$(python3 - "$build" <<'EOF'
import re, sys
m = re.search(r'srcs = \["([^"]+)"\]', sys.argv[1])
print(m.group(1) if m else "")
EOF
)
  src="${src#//}"; src="${src/:/\/}"  # //tools/dpe:dpe_devices_test.sh -> tools/dpe/dpe_devices_test.sh
  [[ "$src" == */* ]] || src="$pkg/$src"
  if [[ ! -f "$src" ]]; then log "WARNING: $label: script $src not found; skipped"; continue; fi
  script="bin/sh/$(flat "$label").sh"
  cp "$src" "$stage/$script"
  chmod 755 "$stage/$script"
  # Helpers a script sources from its own directory (source "$(dirname "$0")/test_lib.sh") go beside it.
  for helper in $(sed -n 's|^source "$(dirname "$0")/\([A-Za-z0-9_.-]*\)".*|\1|p' "$src"); do
    cp "$(dirname "$src")/$helper" "$stage/bin/sh/$helper"
  done
  extra=$(test_args "$label" "$build") || continue
  line="$(flat "$label")"$'\t'sh$'\t'"$script$extra"
  copy_runfiles_data "$label"
  echo "$line" >>"$tests_tsv"
done
log "${#sh_tests[@]} sh_test targets -> bin/sh/"
log "$(wc -l <"$tests_tsv") tests listed in tests.tsv; $(find "$stage/runfiles" -type f | wc -l) data files -> runfiles/"

# --- system data --------------------------------------------------------------------------------------------
# Tests and tools read some data by absolute path from Debian data packages that tools/setup.sh installs
# (data/fashion_mnist.h, data/text_corpus.h). The GPU machine has none of them: their files go to sysdata/
# (sysdata/usr/share/...), which run_suite.sh copies to / where missing. Open MPI too (the tests across
# processes run under mpirun): its launcher, its components (dlopen'ed from its own directories), PMIx, the
# help texts and configuration; the libraries they link come with lib/ like every other.
sysdata_packages=(dataset-fashion-mnist fortunes-min openmpi-bin openmpi-common libopenmpi3 libpmix2)
n_sys=0
for pkg in "${sysdata_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    log "WARNING: data package $pkg is not installed here; tests that read its files will fail there"
    continue
  fi
  while IFS= read -r f; do
    [[ -f "$f" || -L "$f" ]] || continue
    case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
    mkdir -p "$stage/sysdata$(dirname "$f")"
    if [[ "$f" == *.gz && ! -L "$f" ]]; then
      # Stored decompressed, which the payload's xz compresses further than gzip did (Fashion-MNIST's 30.9 MB
      # of .gz files: 4 MB less), and gzipped back into place by run_suite.sh.
      gzip -dc "$f" >"$stage/sysdata$f.gunzipped"
    else
      cp -a "$f" "$stage/sysdata$f"
    fi
    n_sys=$((n_sys + 1))
  done < <(dpkg -L "$pkg")
done
log "$n_sys files of ${sysdata_packages[*]} -> sysdata/"

# --- shared libraries ---------------------------------------------------------------------------------------
# Never bundled: glibc (any Linux has it), the driver, the CUDA libraries (the GPU image has them: CUDA 13
# toolkit and PyTorch's nvidia-* wheels), the vDSO. libstdc++/libgcc_s go to lib/compat/ (used only when needed).
is_cuda_lib() {
  case "$1" in
    libcuda.so* | libnvidia-* | libcudart.so* | libcublas* | libcudnn* | libnccl* | libnvrtc* | libnvJitLink* | \
      libcufft* | libcurand* | libcusolver* | libcusparse* | libcupti* | libnvToolsExt* | libnvtx*) return 0 ;;
  esac
  return 1
}
is_base_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libmvec.so* | libpthread.so* | libdl.so* | librt.so* | \
      libresolv.so* | libutil.so*) return 0 ;;
  esac
  return 1
}
declare -A cuda_needed
n_libs=0
while IFS= read -r -d '' exe; do
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    if is_base_lib "$soname"; then continue; fi
    if is_cuda_lib "$soname"; then cuda_needed[$soname]=1; continue; fi
    if [[ "$path" == "not" ]]; then
      echo "package: $exe needs $soname, which is not found here" >&2
      exit 1
    fi
    case "$soname" in
      libstdc++.so* | libgcc_s.so*) dest="$stage/lib/compat/$soname" ;;
      *) dest="$stage/lib/$soname" ;;
    esac
    if [[ ! -e "$dest" ]]; then
      cp -L "$path" "$dest"
      # dpe's own libraries (bazel-bin/_solib_*) carry -g1 debug info too.
      case "$path" in "$bin_dir"/* | "$exec_root"/* | */_solib_*) strip --strip-debug "$dest" ;; esac
      n_libs=$((n_libs + 1))
    fi
  done < <(ldd "$exe" 2>/dev/null)
done < <(printf '%s\0' "${originals[@]}")
chmod 644 "$stage"/lib/*.so* "$stage"/lib/compat/*.so* 2>/dev/null || true
log "$n_libs shared libraries -> lib/ and lib/compat/ (CUDA libraries expected on the GPU machine: ${!cuda_needed[*]})"

# --- the runner and the manifest ----------------------------------------------------------------------------
cp tools/gpu/run_suite.sh "$stage/run_suite.sh"
chmod 755 "$stage/run_suite.sh"

{
  echo "dpe GPU bundle (tools/gpu/package.sh)"
  echo "built:      $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "commit:     $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (working tree had uncommitted changes)')"
  echo "nvcc:       $("${DPE_CUDA_PATH:-/usr/local/cuda}/bin/nvcc" --version | tail -1)"
  echo "archs:      $(grep -o 'arch=compute_[0-9]*,code=[a-z_0-9]*' tools/build/defs.bzl | tr '\n' ' ')"
  for h in cudnn_version.h nccl.h; do
    f="${DPE_CUDA_PATH:-/usr/local/cuda}/include/$h"
    [[ -f "$f" ]] && echo "$h:$(grep -E '#define (CUDNN_MAJOR|CUDNN_MINOR|CUDNN_PATCHLEVEL|NCCL_MAJOR|NCCL_MINOR|NCCL_PATCH)\b' "$f" | awk '{printf " %s=%s", $2, $3}')"
  done
  echo "cuda_sonames: ${!cuda_needed[*]}"
  echo "bazel_args: ${bazel_args[*]:-}"
} >"$stage/MANIFEST.txt"

# --- sizes, then OUT_DIR ------------------------------------------------------------------------------------
echo
log "contents (uncompressed):"
for d in bin/tests bin/tools bin/bench bin/sh runfiles sysdata lib lib/compat; do
  printf '  %-12s %8s  %3d files\n' "$d" "$(du -sh --apparent-size "$stage/$d" | cut -f1)" \
    "$(find "$stage/$d" -type f | wc -l)"
done
echo "  largest files:"
find "$stage" -type f -printf '%s %P\n' | sort -rn | sed -n 1,6p | while read -r s p; do printf '    %8s  %s\n' "$(human "$s")" "$p"; done
log "uncompressed total $(human "$(du -sb "$stage" | cut -f1)")"

rm -rf "$out"
mkdir -p "$out"
if ((compress)); then
  # The tree is ~190 MiB (oneDNN and OpenBLAS are 38 and 35 MiB, each cc_binary ~8 MiB, Fashion-MNIST 30 MiB
  # of gzip). xz -9 (64 MiB window: the CUDA kernels repeated in every binary compress away) brings it to
  # ~50 MiB, inside the device machine's 64 MiB transfer limit with the repo. run_suite.sh unpacks it there.
  log "compressing (xz -9)..."
  tar -C "$stage" -cf - . | xz -T0 -9 >"$out/payload.tar.xz"
  cp "$stage/run_suite.sh" "$stage/MANIFEST.txt" "$stage/.dpe_gpu_bundle" "$out/"
else
  cp -a "$stage/." "$out/"
fi
echo
log "bundle $out:"
find "$out" -type f -printf '%s %P\n' | sort -rn | sed -n 1,6p | while read -r s p; do printf '    %8s  %s\n' "$(human "$s")" "$p"; done
total=$(du -sb "$out" | cut -f1)
log "total $(human "$total") ($total bytes)"
if ((total > 60 * 1024 * 1024)); then
  log "WARNING: over 60 MiB: with the repo it may not fit the device machine's 64 MiB transfer limit"
fi
