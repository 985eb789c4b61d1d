#!/usr/bin/env bash
# Proves that applications outside dpe's repository can use it (README, "Embedding dpe in a C++ application"):
#   external_app  examples/external_app, a Bazel workspace of its own (local_repository + dpe_dependencies()),
#                 builds CPU-only and trains in DP and DDP mode;
#   install       `bazel run //:install -- PREFIX` into a temporary PREFIX, then examples/embed_minimal.cc
#                 compiled with plain g++ and pkg-config's flags runs in DP and DDP mode; the installer
#                 rejects a missing or relative PREFIX and accepts one with a space.
# Prints PASS or FAIL per proof and exits 1 if one failed. The external workspace compiles the part of dpe
# its program needs, in its own output base (60 to 90 s on 2 cores the first time, seconds after).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export DPE_NUM_CPU_DEVICES=2
status=0

# The external workspace has its own Bazel server; it stops by itself once the proofs are done.
external_bazel=(bazel --max_idle_secs=120)

external_app() (  # a subshell: it changes directory
  cd examples/external_app || return 1
  "${external_bazel[@]}" build --config=cpu_only --noshow_progress //:train || return 1
  local out rc
  out=$("${external_bazel[@]}" run --config=cpu_only //:train 2>"$tmp/bazel_run.log")
  rc=$?
  echo "$out"
  if [[ $rc -ne 0 ]]; then
    cat "$tmp/bazel_run.log"
    return 1
  fi
  grep -q "^external_app: dp .*: ok$" <<<"$out" && grep -q "^external_app: ddp .*: ok$" <<<"$out"
)

# Runs the installer with these arguments; prints what it says, without Bazel's progress lines.
install_to() {
  bazel run --config=cpu_only //:install -- "$@" 2>&1 | grep -v '^\[\|^INFO\|^Loading\|^Analyzing\|^Target\|^  bazel-bin'
  return "${PIPESTATUS[0]}"
}

install() {
  local prefix="$tmp/prefix"
  install_to "$prefix" || return 1
  # Word splitting is wanted: these are the flags, exactly as an application's build would use them.
  # shellcheck disable=SC2046
  PKG_CONFIG_PATH="$prefix/lib/pkgconfig" g++ -o "$tmp/embed_minimal" examples/embed_minimal.cc \
    $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs dpe) || return 1
  examples/embed_minimal_test.sh "$tmp/embed_minimal" || return 1
  echo "embed_minimal built with g++ and pkg-config: DP and DDP losses fell"

  local out
  for bad in "" "relative/prefix"; do
    out=$(install_to "$bad")
    if [[ $? -ne 2 ]] || ! grep -q "PREFIX '$bad' is" <<<"$out"; then
      echo "the installer accepted PREFIX '$bad' or did not name it: $out"
      return 1
    fi
  done
  out=$(install_to)
  if [[ $? -ne 2 ]] || ! grep -q "expected one argument" <<<"$out"; then
    echo "the installer ran without a PREFIX: $out"
    return 1
  fi
  echo "the installer rejects an empty, a relative and a missing PREFIX"

  # pkg-config escapes the space; read (without -r) splits the flags the way pkg-config means them.
  local spaced="$tmp/with space" flags
  install_to "$spaced" || return 1
  read -a flags <<<"$(PKG_CONFIG_PATH="$spaced/lib/pkgconfig" pkg-config --cflags --libs dpe)"
  g++ -o "$tmp/embed_minimal_spaced" examples/embed_minimal.cc "${flags[@]}" || return 1
  out=$("$tmp/embed_minimal_spaced" --ddp 2>&1) || { echo "$out"; return 1; }
  ldd "$tmp/embed_minimal_spaced" | grep -qF "$spaced/lib/libdpe.so" || { echo "not linked to $spaced"; return 1; }
  echo "a PREFIX with a space: installed, compiled, linked and ran"
}

for proof in external_app install; do
  start=$(date +%s)
  echo "== embedding proof: $proof =="
  if "$proof"; then
    result=PASS
  else
    result=FAIL
    status=1
  fi
  echo "$result: $proof ($(( $(date +%s) - start )) s)"
done
exit $status
