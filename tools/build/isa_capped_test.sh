#!/usr/bin/env bash
# Usage: isa_capped_test.sh CAP TEST [ARGS...]
# Runs TEST (a gtest binary or a shell test, with its ARGS) with dpe's CPU paths capped at CAP (avx2 or avx512:
# Note [The CPU instruction-set cap], core/cpu_isa.h), so that one machine proves the paths a smaller CPU takes.
# OpenBLAS chooses its kernels when it is loaded, before dpe can cap anything, so its core type is capped here
# too. Where the CPU lacks CAP's instructions the run is reported skipped (one skipped test case in Bazel's
# report, with the reason): the native run already covers that CPU's own path.
set -euo pipefail
cap="$1"
shift

# ISA_CAPPED_TEST_CPUINFO: another cpuinfo, for this script's own test (isa_capped_test_test.sh).
flags=$(grep -m1 '^flags' "${ISA_CAPPED_TEST_CPUINFO:-/proc/cpuinfo}" || true)
has() { [[ " ${flags#*:} " == *" $1 "* ]]; }
case "$cap" in
  avx2) needs=(avx2 fma); coretype=Haswell ;;
  avx512) needs=(avx512f avx512bw avx512dq avx512vl); coretype=SkylakeX ;;
  *) echo "isa_capped_test.sh: CAP '$cap': expected avx2 or avx512" >&2; exit 2 ;;
esac
for flag in "${needs[@]}"; do
  if ! has "$flag"; then
    reason="this CPU has no $flag: DPE_MAX_CPU_ISA=$cap would run its native path, which the uncapped run tests"
    echo "SKIPPED: $reason"
    if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
      cat >"$XML_OUTPUT_FILE" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" failures="0" errors="0">
  <testsuite name="IsaCap" tests="1" failures="0" errors="0" skipped="1">
    <testcase name="$cap" classname="IsaCap" result="skipped"><skipped message="$reason"/></testcase>
  </testsuite>
</testsuites>
EOF
    fi
    exit 0
  fi
done

echo "DPE_MAX_CPU_ISA=$cap OPENBLAS_CORETYPE=$coretype"
export DPE_MAX_CPU_ISA="$cap" OPENBLAS_CORETYPE="$coretype"
exec "$@"
