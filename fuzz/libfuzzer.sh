#!/usr/bin/env bash
# Coverage-guided fuzzing with clang's libFuzzer, outside Bazel (which builds with GCC): the harnesses are
# libFuzzer entry points, so they compile unchanged. Optional; needs `apt-get install clang libclang-rt-14-dev`.
#
#   fuzz/libfuzzer.sh json|device_list|idx|checkpoint|text_corpus [libFuzzer options, e.g. -max_total_time=300]
#
# Builds out/libfuzzer/<harness>_fuzz with ASan + UBSan (objects cached in out/libfuzzer/obj, rebuilt when a
# source or header is newer), copies the seed corpus to out/libfuzzer/corpus/<harness> (where libFuzzer adds
# what it finds; fuzz/corpus stays as committed) and runs it there with the dictionary; crash-* files land in
# out/libfuzzer/. docs/FUZZING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
harness=${1:?usage: fuzz/libfuzzer.sh json|device_list|idx|checkpoint|text_corpus [libFuzzer options]}
shift
command -v clang++ >/dev/null || { echo "needs clang: apt-get install clang libclang-rt-14-dev" >&2; exit 2; }

# What each harness links besides fuzz/fuzz_target.cc (the Bazel deps, as sources).
case $harness in
  json) srcs="io/safetensors_header.cc core/error.cc" ;;
  device_list) srcs="tools/dpe/cli_util.cc core/device.cc core/error.cc" ;;
  idx) srcs="data/idx_reader.cc core/error.cc" ;;
  checkpoint)
    srcs="$(ls core/*.cc core/*/*.cc layers/*.cc optim/*.cc scatter_gather/*.cc | grep -v -e _test.cc -e cuda -e nccl)"
    srcs="$srcs io/checkpoint.cc io/safetensors_header.cc"
    ;;
  text_corpus) srcs="$(ls core/*.cc core/*/*.cc | grep -v -e _test.cc -e cuda) data/text_corpus.cc" ;;
  *) echo "unknown harness '$harness' (json, device_list, idx, checkpoint, text_corpus)" >&2; exit 2 ;;
esac

out=out/libfuzzer
mkdir -p "$out/obj" "$out/corpus/$harness"
cxx=(clang++ -std=c++20 -O1 -g -march=x86-64-v3 -fsanitize=address,undefined -fno-sanitize-recover=undefined
     -fsanitize-recover=alignment -I. -isystem /usr/include/x86_64-linux-gnu/openblas-pthread)
newest_header=$(find core data engine layers optim scatter_gather tools/dpe fuzz -name '*.h' -newer "$out/obj" 2>/dev/null | head -1)
objs=()
for f in $srcs fuzz/fuzz_target.cc; do
  o="$out/obj/$(echo "$f" | tr / _).o"
  if [[ ! -f $o || $f -nt $o || -n $newest_header ]]; then
    echo "clang++ $f"
    "${cxx[@]}" -fsanitize=fuzzer-no-link -c "$f" -o "$o"
  fi
  objs+=("$o")
done
touch "$out/obj"
"${cxx[@]}" -fsanitize=fuzzer "fuzz/${harness}_fuzz.cc" "${objs[@]}" -ldnnl -ltbb -lopenblas -lz -fopenmp \
  -o "$out/${harness}_fuzz"

cp -n "fuzz/corpus/$harness/"* "$out/corpus/$harness/"
cd "$out"
# A tiny input that allocates more than 2 GiB or grows RSS past 2 GiB is a finding, as in fuzz/fuzz_driver.cc.
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$OLDPWD/tools/sanitizers/ubsan.supp" \
  exec "./${harness}_fuzz" -malloc_limit_mb=2048 -rss_limit_mb=2048 -dict="$OLDPWD/fuzz/dicts/$harness.dict" \
  "$@" "corpus/$harness"
