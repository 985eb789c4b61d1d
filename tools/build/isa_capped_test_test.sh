#!/usr/bin/env bash
# isa_capped_test.sh: sets the cap (and OpenBLAS's core type) for the test it runs, passing its arguments
# and exit status through; where the CPU lacks the cap's instructions, reports one skipped case in Bazel's XML
# and runs nothing; refuses an unknown cap.
wrapper="$1"
fail=0
dir="${TEST_TMPDIR:-$(mktemp -d)}"
check() { if ! eval "$1"; then echo "FAILED: $1"; fail=1; fi; }

printf 'processor\t: 0\nflags\t\t: fpu avx avx2 fma avx512f avx512dq avx512bw avx512vl\n' >"$dir/avx512"
printf 'processor\t: 0\nflags\t\t: fpu avx avx2 fma\n' >"$dir/avx2"

# Runs: the environment and arguments reach the test, its status comes back.
out=$(ISA_CAPPED_TEST_CPUINFO="$dir/avx512" XML_OUTPUT_FILE="$dir/run.xml" "$wrapper" avx2 \
  bash -c 'echo "cap=$DPE_MAX_CPU_ISA blas=$OPENBLAS_CORETYPE args=$*"; exit 7' _ a 'b c')
status=$?
check '[[ $status -eq 7 ]]'
check '[[ $out == *"cap=avx2 blas=Haswell args=a b c"* ]]'
check '[[ ! -e $dir/run.xml ]]'
out=$(ISA_CAPPED_TEST_CPUINFO="$dir/avx512" "$wrapper" avx512 bash -c 'echo "cap=$DPE_MAX_CPU_ISA blas=$OPENBLAS_CORETYPE"')
check '[[ $out == *"cap=avx512 blas=SkylakeX"* ]]'

# Skipped: a CPU without AVX-512 runs nothing under the avx512 cap and says why.
out=$(ISA_CAPPED_TEST_CPUINFO="$dir/avx2" XML_OUTPUT_FILE="$dir/skip.xml" "$wrapper" avx512 bash -c 'echo RAN; exit 1')
status=$?
check '[[ $status -eq 0 ]]'
check '[[ $out != *RAN* && $out == *"SKIPPED: this CPU has no avx512f"* ]]'
check 'grep -q "<testcase name=\"avx512\" classname=\"IsaCap\" result=\"skipped\"><skipped message=\"this CPU has no avx512f" "$dir/skip.xml"'
check 'python3 -c "import sys, xml.etree.ElementTree as ET; ET.parse(sys.argv[1])" "$dir/skip.xml"'

# An unknown cap is an error naming it.
out=$("$wrapper" sse4 true 2>&1)
status=$?
check '[[ $status -eq 2 && $out == *"CAP '"'"'sse4'"'"': expected avx2 or avx512"* ]]'
exit $fail
