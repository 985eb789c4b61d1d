#!/usr/bin/env bash
# run_suite.sh's verdicts on what compute-sanitizer prints, without a GPU: a bundle of one test binary
# (run_suite_fixture: a case the CUDA filter picks, making no CUDA call), stand-ins for nvidia-smi (one GPU)
# and for compute-sanitizer (it runs the program, then prints what $FAKE_SANITIZER names), and the runner's
# sanitizer pass over the picked case. A host-only binary's sanitizer rows are rows with nothing to check, not
# failures ("no summary", as they were once counted).
#   run_suite_test.sh RUN_SUITE_SH FIXTURE_BINARY
set -uo pipefail
runner="$1" fixture="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
bundle="$tmp/bundle" fakes="$tmp/fakes"
mkdir -p "$bundle/bin/tests" "$bundle/runfiles" "$fakes"
cp "$runner" "$bundle/run_suite.sh"
cp "$fixture" "$bundle/bin/tests/fixture"
printf 'fixture\tgtest\tbin/tests/fixture\n' >"$bundle/tests.tsv"
echo "a bundle of one fixture (tools/gpu/run_suite_test.sh)" >"$bundle/MANIFEST.txt"

cat >"$fakes/nvidia-smi" <<'SMI'
#!/bin/sh
[ "$1" = -L ] && echo "GPU 0: stand-in (UUID: GPU-0)"
exit 0
SMI
cat >"$fakes/compute-sanitizer" <<'SANITIZER'
#!/usr/bin/env bash
# FAKE_SANITIZER: no-cuda (what compute-sanitizer prints for a program that made no CUDA call: no summary,
# exit status 255), clean (0 errors) or errors (3 errors, the program's exit status).
[[ "$1" == --version ]] && { echo "Version stand-in"; exit 0; }
while [[ "$1" == --* ]]; do shift 2; done  # --tool T --report-api-errors no --print-limit N
echo "========= COMPUTE-SANITIZER"
"$@"
rc=$?
case "$FAKE_SANITIZER" in
  no-cuda) echo "========= Error: Target application terminated before first instrumented API call"; exit 255 ;;
  clean) echo "========= ERROR SUMMARY: 0 errors" ;;
  errors) echo "========= ERROR SUMMARY: 3 errors" ;;
esac
exit $rc
SANITIZER
chmod 755 "$fakes/nvidia-smi" "$fakes/compute-sanitizer"

fail=0
extra=()  # more arguments for run_suite.sh
# check DESCRIPTION FAKE_SANITIZER FIXTURE_FAIL WANT_STATUS PATTERN...: the sanitizer pass exits with
# WANT_STATUS and its console output holds every PATTERN.
check() {
  local what="$1" mode="$2" fixture_fail="$3" want="$4"
  shift 4
  local out status
  out=$(FAKE_SANITIZER="$mode" FIXTURE_FAIL="$fixture_fail" PATH="$fakes:$PATH" bash "$bundle/run_suite.sh" \
    "$tmp/out" --sanitizer-only --sanitizer-tools=memcheck --cuda-filter='*Gpu*' --budget=120 "${extra[@]}" 2>&1)
  status=$?
  local ok=1
  ((status == want)) || ok=0
  for pattern in "$@"; do grep -qF -- "$pattern" <<<"$out" || ok=0; done
  if ((ok)); then
    echo "ok: $what"
  else
    echo "FAILED: $what: exit status $status (want $want), want every one of: $*; output:"
    echo "$out" | tail -15
    fail=1
  fi
}

check "no CUDA call: nothing to check, neither passed nor failed" no-cuda 0 0 \
  "fixture@memcheck" "NOTHING TO CHECK (no CUDA call)" "0 passed, 0 failed, 1 skipped" \
  "its tests made no CUDA call, so compute-sanitizer checked nothing"
check "no CUDA call, but the test failed: a failure" no-cuda 1 1 \
  "HostOnly.NamedLikeAGpuTest" "0 passed, 2 failed, 0 skipped"
check "a clean run passes" clean 0 0 "fixture@memcheck" "1 passed, 0 failed, 0 skipped"
check "sanitizer errors fail" errors 0 1 "3 SANITIZER ERRORS" "3 compute-sanitizer errors"
# --only picks the sanitizer's tests too: the fixture named runs, any other list leaves it out.
extra=(--only=fixture)
check "--only naming the test" clean 0 0 "fixture@memcheck" "1 passed, 0 failed, 0 skipped"
extra=(--only=core.norm_test)
check "--only naming another test" errors 0 0 "0 passed, 0 failed, 0 skipped"
exit $fail
