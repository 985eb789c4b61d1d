# Sourced by the dpe tool's shell tests: a test sets `fail=0`, calls these, and ends with `exit $fail`.

# run DESCRIPTION COMMAND...: the command must succeed; its output (stdout and stderr) is left in $out.
run() {
  local what="$1"; shift
  if ! out=$("$@" 2>&1); then echo "FAILED ($what): $*"; echo "$out" | tail -20; fail=1; fi
}

# expect STATUS PATTERN COMMAND...: the command exits with STATUS and its output contains PATTERN.
expect() {
  local want_status="$1" pattern="$2"; shift 2
  out=$("$@" 2>&1)
  local status=$?
  if [[ $status -ne $want_status ]] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAILED: $* -> status $status (want $want_status, 124 = timed out), want '$pattern', output:"
    echo "$out" | tail -5
    fail=1
  fi
}

# first_cpus N: the first N CPUs this process may run on, as a taskset list ("0,1").
first_cpus() {
  python3 -c 'import os, sys; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:int(sys.argv[1])])))' "$1"
}
