#!/usr/bin/env bash
# Runs the packaged dpe tests and benchmarks (tools/gpu/package.sh) on the machine at hand, typically a bare
# GPU machine. Run it from anywhere; it lives at the bundle's root:
#
#   bash gpu_bundle/run_suite.sh [OUT_DIR] [options]
#
# It first unpacks payload.tar.xz into $DPE_BUNDLE_DIR (default /tmp/dpe_gpu_bundle, replaced each time).
# OUT_DIR (e.g. the device machine's $OUT) receives only summary.txt and logs.tar.gz (every log and gtest XML);
# the working files go to results/ in the unpacked tree (wiped at each start). Without OUT_DIR, only there.
#
# Steps, in order, each skipped once the time budget is spent (what was not run is listed, never passed):
#   1. environment: nvidia-smi, the CUDA libraries the binaries resolve to, system data, `dpe devices`
#   2. every test in tests.tsv (gtest binaries with --gtest_output=xml; sh tests and other executables, the
#      fuzz harnesses, by exit status)
#   3. with a GPU: the CUDA tests again with DPE_CUDA_LOGICAL_DEVICES=0,0 (two logical devices on GPU 0),
#      which the multi-device CUDA tests need on a one-GPU machine, and the engine's with 0,0,0,0 (four)
#   4. benchmarks: bin/bench/*; with a GPU also `dpe bench` (the 124M Llama in bf16 first; mlp, cnn, tiny-llama;
#      single, DP, DDP) and `dpe collectives`, with JSON results in results/bench/
#   5. with --sanitizer: the CUDA tests under compute-sanitizer (memcheck, racecheck by default)
#
# Options:
#   --sanitizer            also run step 5;  --sanitizer-only: steps 1 and 5 alone
#   --sanitizer-tools=L    comma-separated compute-sanitizer tools (default memcheck,racecheck)
#   --no-bench             skip step 4;  --bench-only: steps 1 and 4 alone
#   --filter=PATTERN       a gtest filter for step 2 (default: all tests); --cuda-filter=PATTERN: the filter
#                          that selects CUDA tests in steps 3 and 5 (default *Cuda*:*CUDA*:*Gpu*:*GPU*:*Parity*)
#   --only=NAMES           steps 2, 3 and 5 run only these tests.tsv entries, comma-separated (any kind: a rerun
#                          of what failed, e.g. --only=engine.ddp_test,tools.dpe.dpe_bench_test)
#   --benches=REGEX        step 4 runs only the benchmarks whose names match this bash regex (e.g. 'cnn|profile')
#   --rounds=N             step 4 runs the dpe-beside-PyTorch rows N times, alternating models (default 1;
#                          the later rounds' names end in .r2, .r3, ...): GPU step times vary from run to run
#   --bench-steps=N        timed steps of each dpe-beside-PyTorch row, both sides (default 30; warm-up N/10,
#                          at least 5): a 1.5 ms step timed over 30 steps swings by 20% from run to run
#   --budget=SECONDS       stop starting new runs after this long (default 540: a device call lasts 600 s)
#   --timeout=SECONDS      one binary's limit (default 300; under the sanitizer 420)
#
# Counting: per test case, from the gtest XML (or the log, if the binary died before writing it). A skipped
# test is counted as skipped, never as passed. On a machine with a GPU, a test that skipped saying there is no
# CUDA device or no CUDA support counts as failed: it means the GPU was not usable from dpe. A binary that
# crashed, timed out or exited non-zero with no failed case adds one failure. Exit status 1 if anything failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out_dir=""
sanitizer=0 tests=1 bench=1
san_tools="memcheck,racecheck"
filter=""
only=""
benches=""
rounds=1
bench_steps=30
cuda_filter='*Cuda*:*CUDA*:*Gpu*:*GPU*:*Parity*'
budget=540 timeout_s=300 san_timeout_s=420
for arg in "$@"; do
  case "$arg" in
    --sanitizer) sanitizer=1 ;;
    --sanitizer-only) sanitizer=1 tests=0 bench=0 ;;
    --sanitizer-tools=*) san_tools="${arg#*=}" ;;
    --no-bench) bench=0 ;;
    --bench-only) bench=1 tests=0 sanitizer=0 ;;
    --filter=*) filter="${arg#*=}" ;;
    --only=*) only=",${arg#*=}," ;;
    --benches=*) benches="${arg#*=}" ;;
    --rounds=*) rounds="${arg#*=}" ;;
    --bench-steps=*) bench_steps="${arg#*=}" ;;
    --cuda-filter=*) cuda_filter="${arg#*=}" ;;
    --budget=*) budget="${arg#*=}" ;;
    --timeout=*) timeout_s="${arg#*=}" san_timeout_s="${arg#*=}" ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run_suite: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) out_dir="$arg" ;;
  esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "run_suite: --rounds=$rounds: expected a positive whole number" >&2; exit 2; }
[[ $bench_steps =~ ^[1-9][0-9]*$ ]] ||
  { echo "run_suite: --bench-steps=$bench_steps: expected a positive whole number" >&2; exit 2; }
bench_warmup=$((bench_steps / 10 > 5 ? bench_steps / 10 : 5))
case "$out_dir" in "" | /*) ;; *) out_dir="$(pwd)/$out_dir" ;; esac

# The bundle's tree: here (package.sh --no-compress), or payload.tar.xz unpacked afresh into $DPE_BUNDLE_DIR.
if [[ -f "$here/tests.tsv" ]]; then
  bundle="$here"
elif [[ -f "$here/payload.tar.xz" ]]; then
  bundle="${DPE_BUNDLE_DIR:-${TMPDIR:-/tmp}/dpe_gpu_bundle}"
  if [[ -e "$bundle" && ! -f "$bundle/.dpe_gpu_bundle" ]]; then
    echo "run_suite: $bundle exists and is not an unpacked bundle; set DPE_BUNDLE_DIR elsewhere" >&2
    exit 2
  fi
  rm -rf "$bundle"
  mkdir -p "$bundle"
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$here/payload.tar.xz" | tar -C "$bundle" -xf - || exit 2
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$here/payload.tar.xz" "$bundle" || exit 2
  fi
  echo "run_suite: unpacked $here/payload.tar.xz into $bundle ($(du -sh "$bundle" | cut -f1))"
else
  echo "run_suite: neither tests.tsv nor payload.tar.xz beside $0: not a bundle from tools/gpu/package.sh" >&2
  exit 2
fi

start=$SECONDS
results="$bundle/results"
rm -rf "$results"
mkdir -p "$results"/{logs,xml,tmp}
summary="$results/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }        # to the console and summary.txt
note() { echo "$*" >>"$summary"; }              # summary.txt only
left() { echo $((budget - (SECONDS - start))); }

# --- environment --------------------------------------------------------------------------------------------
# Helpers (python3) run with the machine's own library path: the bundle's libz or libgomp are for dpe alone.
orig_ld="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GTEST_COLOR=no
cd "$bundle/runfiles" || exit 2   # tests open their data relative to the runfiles root, as under bazel test

say "== dpe GPU suite: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nproc) cores"
sed 's/^/   /' "$bundle/MANIFEST.txt" | tee -a "$summary"

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  smi=$(nvidia-smi 2>&1)
  echo "$smi" >"$results/logs/nvidia-smi.txt"
  echo "$smi"
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  say "-- GPUs: $gpus"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv 2>&1 | sed 's/^/   /' | tee -a "$summary"
else
  say "-- nvidia-smi not found: no GPU; CUDA tests will skip (and count as skipped)"
fi

# CUDA libraries: the GPU image has the CUDA 13 toolkit in /usr/local/cuda and PyTorch's nvidia-* wheels;
# cuDNN and NCCL may be only in the latter. Add each folder that holds a soname the binaries miss.
cuda_dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
for py in python3 /opt/torch/.venv/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  site=$(LD_LIBRARY_PATH="$orig_ld" "$py" -c 'import site, sys; print("\n".join(site.getsitepackages()))' 2>/dev/null) || continue
  while IFS= read -r s; do
    for d in "$s"/nvidia/*/lib "$s"/nvidia/cu*/lib "$s"/torch/lib; do [[ -d "$d" ]] && cuda_dirs+=("$d"); done
  done <<<"$site"
done
mapfile -t binaries < <(find "$bundle/bin" -type f ! -name '*.sh' | sort)
missing_libs() { for b in "${binaries[@]}"; do ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 == "not" {print $1}'; done | sort -u; }
mapfile -t missing < <(missing_libs)
for so in "${missing[@]}"; do
  for d in "${cuda_dirs[@]}"; do
    if [[ -e "$d/$so" ]]; then
      case ":$LD_LIBRARY_PATH:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d" ;; esac
      break
    fi
  done
done
# libstdc++/libgcc_s: the machine's, unless too old for these binaries (then the bundled Debian 12 ones).
probe="${binaries[0]:-}"
if [[ -n "$probe" ]] && ldd "$probe" 2>&1 | grep -q "version \`GLIBCXX\|version \`GCC_"; then
  export LD_LIBRARY_PATH="$bundle/lib/compat:$LD_LIBRARY_PATH"
  say "-- the machine's libstdc++ is too old: using the bundled one (lib/compat)"
fi
mapfile -t missing < <(missing_libs)
say "-- LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [[ -n "${binaries[0]:-}" ]]; then
  # Which file each CUDA soname resolves to (from the binary that needs the most of them).
  widest=$(for b in "${binaries[@]}"; do echo "$(ldd "$b" 2>/dev/null | grep -c -E 'libcu|libnccl') $b"; done | sort -rn | head -1 | cut -d' ' -f2-)
  ldd "$widest" 2>/dev/null | grep -E 'libcu|libnccl|libnv' | sed 's/^[[:space:]]*/   /' | tee -a "$summary"
fi
if ((${#missing[@]} > 0)); then
  say "!! shared libraries not found (binaries that need them will fail): ${missing[*]}"
fi

# Data the tests read by absolute path (Debian data packages here: Fashion-MNIST, fortunes): copied to / where
# missing (the device machine runs commands as root and is discarded after the run). Never overwrites.
if [[ -d "$bundle/sysdata" ]]; then
  present=0 installed=0 failed_sys=0
  # install_sysdata FILE DEST: a copy, or for NAME.gz.gunzipped (package.sh stores .gz files decompressed) the
  # file gzipped again; nothing left behind on failure.
  install_sysdata() {
    mkdir -p "$(dirname "$2")" 2>/dev/null || return 1
    if [[ "$1" == *.gz.gunzipped ]]; then
      gzip -n -c "$1" >"$2" 2>/dev/null || { rm -f "$2"; return 1; }
    else
      cp -a "$1" "$2" 2>/dev/null
    fi
  }
  while IFS= read -r -d '' f; do
    dest="/${f#"$bundle"/sysdata/}"
    [[ "$dest" == *.gz.gunzipped ]] && dest="${dest%.gunzipped}"
    if [[ -e "$dest" || -L "$dest" ]]; then
      present=$((present + 1))
    elif install_sysdata "$f" "$dest"; then
      installed=$((installed + 1))
    else
      failed_sys=$((failed_sys + 1))
    fi
  done < <(find "$bundle/sysdata" \( -type f -o -type l \) -print0)
  dirs=$(cd "$bundle/sysdata" && find . \( -type f -o -type l \) -printf '/%h\n' | sed 's|^/\./|/|' | sort -u | paste -sd' ')
  say "-- system data in $dirs: $present files already there, $installed installed"
  ((failed_sys > 0)) && say "!! $failed_sys system data files could not be installed (not root?): tests reading them will fail"
fi

# The device list dpe sees (a GPU that is there but unusable shows here, with the reason).
dpe_tool="$bundle/bin/tools/tools.dpe.dpe"
dev_cmd=()
if [[ -x "$dpe_tool" ]]; then
  dev_cmd=("$dpe_tool" devices)
else
  t=$(find "$bundle/bin/tools" -name '*dpe_devices' -type f | head -1)
  [[ -n "$t" ]] && dev_cmd=("$t")
fi
if ((${#dev_cmd[@]} > 0)); then
  say "-- dpe devices:"
  "${dev_cmd[@]}" 2>&1 | sed 's/^/   /' | tee -a "$summary"
fi

# --- running and counting -----------------------------------------------------------------------------------
rows=()                      # one table row per run
total_pass=0 total_fail=0 total_skip=0
fail_cases=() skip_cases=() not_run=()

# count_xml XML LOG -> "passed failed skipped", then one line per failed case ("F name") and skipped case
# ("S name: message"). The XML when it exists, else the gtest log (a binary that died writes no XML).
count_results() {
  local xml="$1" log="$2"
  if [[ -s "$xml" ]] && command -v python3 >/dev/null 2>&1; then
    LD_LIBRARY_PATH="$orig_ld" python3 - "$xml" <<'EOF' && return 0
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
p = f = s = 0
lines = []
for case in root.iter("testcase"):
    name = f"{case.get('classname')}.{case.get('name')}"
    if case.get("status") == "notrun":
        continue  # DISABLED_ tests
    if case.find("failure") is not None or case.find("error") is not None:
        f += 1
        lines.append(f"F {name}")
    elif case.get("result") == "skipped" or case.find("skipped") is not None:
        s += 1
        sk = case.find("skipped")
        msg = (sk.get("message") or sk.text or "") if sk is not None else ""
        msg = " ".join(msg.split())
        lines.append(f"S {name}: {msg[:160]}")
    else:
        p += 1
print(p, f, s)
print("\n".join(lines))
EOF
  fi
  # Fallback: gtest's console output.
  local p f s
  p=$(grep -c '^\[       OK \]' "$log")
  f=$(grep -E '^\[  FAILED  \] [A-Za-z_0-9/]+\.[A-Za-z_0-9/]+' "$log" | grep -v ', listed below' | sort -u | wc -l)
  s=$(grep -E '^\[  SKIPPED \] [A-Za-z_0-9/]+\.[A-Za-z_0-9/]+' "$log" | grep -v ', listed below' | sort -u | wc -l)
  echo "$p $f $s"
  grep -E '^\[  FAILED  \] [A-Za-z_0-9/]+\.[A-Za-z_0-9/]+' "$log" | grep -v ', listed below' | sort -u | sed 's/^\[  FAILED  \] /F /; s/ (.*//'
  grep -E '^\[  SKIPPED \] [A-Za-z_0-9/]+\.[A-Za-z_0-9/]+' "$log" | grep -v ', listed below' | sort -u | sed 's/^\[  SKIPPED \] /S /; s/ (.*//'
}

# A skip that means "this machine's GPU was not usable", which on a GPU machine is a failure.
# Errors compute-sanitizer reported in LOG: memcheck, synccheck and initcheck end with "ERROR SUMMARY: N errors",
# racecheck with "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
sanitizer_errors() {
  grep -oE '^========= (ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ error)' "$1" |
    grep -oE '[0-9]+ error' | awk '{s += $1} END {print s + 0}'
}
# What compute-sanitizer says (exit status 255, no summary) when the program it ran never called CUDA.
san_no_cuda_call='^========= Error: Target application terminated before first instrumented API call'
gpu_unusable_skip() { grep -qiE 'no CUDA device|no CUDA support|has no CUDA|no GPU' <<<"$1"; }

# run_one LABEL KIND TIMEOUT ENV_ASSIGNMENTS -- CMD...   (KIND: gtest | san: GoogleTest XML; sh | exe: exit status)
run_one() {
  local label="$1" kind="$2" limit="$3" envs="$4"
  shift 5
  local remaining
  remaining=$(left)
  if ((remaining <= 5)); then
    not_run+=("$label")
    rows+=("$(printf '%-44s %6s %6s %6s %7s  %s' "$label" - - - - "NOT RUN (time budget spent)")")
    return
  fi
  ((limit > remaining)) && limit=$remaining
  local log="$results/logs/$label.log" xml="$results/xml/$label.xml" tmp="$results/tmp/$label"
  mkdir -p "$tmp"
  local cmd=("$@")
  [[ "$kind" == gtest || "$kind" == san ]] && cmd+=("--gtest_output=xml:$xml")
  local t0=$SECONDS rc
  # shellcheck disable=SC2086
  env TEST_TMPDIR="$tmp" $envs timeout -k 10 "$limit" "${cmd[@]}" >"$log" 2>&1
  rc=$?
  local secs=$((SECONDS - t0))
  rm -rf "$tmp"

  local p=0 f=0 s=0 status="ok" detail
  if [[ "$kind" == sh || "$kind" == exe ]]; then
    if ((rc == 0)); then
      p=1
    elif ((rc != 124 && rc != 137)); then
      f=1; status="FAILED (rc $rc)"; fail_cases+=("$label: exit status $rc")
    fi
  else
    detail=$(count_results "$xml" "$log")
    read -r p f s <<<"$(head -1 <<<"$detail")"
    while IFS= read -r line; do
      [[ -z "$line" ]] && continue
      case "$line" in
        F\ *) fail_cases+=("$label: ${line#F }") ;;
        S\ *)
          if ((gpus > 0)) && gpu_unusable_skip "$line"; then
            s=$((s - 1)) f=$((f + 1))
            fail_cases+=("$label: ${line#S } [skipped on a machine with a GPU]")
          else
            skip_cases+=("$label: ${line#S }")
          fi ;;
      esac
    done < <(tail -n +2 <<<"$detail")
  fi
  if ((rc == 124 || rc == 137)); then
    status="TIMEOUT after ${limit}s"; f=$((f + 1)); fail_cases+=("$label: timed out after ${limit}s")
  elif [[ "$kind" == san ]] && ((f == 0)) && grep -q "$san_no_cuda_call" "$log"; then
    # The selected tests passed without one CUDA call (a host-side test whose name matches the CUDA filter):
    # compute-sanitizer checked nothing, which is neither a pass nor a failure of the sanitizer.
    status="NOTHING TO CHECK (no CUDA call)"; s=$((s + p)) p=0
    skip_cases+=("$label: its tests made no CUDA call, so compute-sanitizer checked nothing")
  elif [[ "$kind" == san ]] && ! grep -qE '^========= (ERROR|RACECHECK) SUMMARY' "$log"; then
    status="NO SANITIZER SUMMARY (rc $rc)"; f=$((f + 1)); fail_cases+=("$label: compute-sanitizer printed no summary (rc $rc)")
  elif [[ "$kind" == san ]] && (($(sanitizer_errors "$log") > 0)); then
    local errors
    errors=$(sanitizer_errors "$log")
    status="$errors SANITIZER ERRORS"; f=$((f + 1)); fail_cases+=("$label: $errors compute-sanitizer errors (logs/$label.log)")
  elif ((rc != 0)) && [[ "$kind" == gtest || "$kind" == san ]]; then
    if ((f == 0)); then
      f=1; fail_cases+=("$label: exit status $rc with no failed test case (crash?)")
    fi
    [[ -s "$xml" ]] && status="FAILED (rc $rc)" || status="CRASHED (rc $rc, no XML)"
  elif ((f > 0)); then
    status="FAILED"
  fi
  total_pass=$((total_pass + p)) total_fail=$((total_fail + f)) total_skip=$((total_skip + s))
  rows+=("$(printf '%-44s %6d %6d %6d %6ds  %s' "$label" "$p" "$f" "$s" "$secs" "$status")")
  printf '   %-44s %4d passed %3d failed %3d skipped %5ds  %s\n' "$label" "$p" "$f" "$s" "$secs" "$status" >&2
}

# has_tests BINARY FILTER: does the binary hold a test case that FILTER selects?
has_tests() { "$1" --gtest_list_tests --gtest_filter="$2" 2>/dev/null | grep -q '^  '; }

mapfile -t suite < <(grep -v '^#' "$bundle/tests.tsv")

if ((tests)); then
  say "== tests${filter:+ (filter $filter)}"
  for line in "${suite[@]}"; do
    IFS=$'\t' read -r -a f <<<"$line"
    name="${f[0]}" kind="${f[1]}"
    [[ -z "$only" || "$only" == *",$name,"* ]] || continue
    argv=("${f[@]:2}")
    argv[0]="$bundle/${argv[0]}"
    for i in "${!argv[@]}"; do [[ "${argv[$i]}" == bin/* ]] && argv[$i]="$bundle/${argv[$i]}"; done
    if [[ "$kind" == gtest ]]; then
      if [[ -n "$filter" ]]; then
        has_tests "${argv[0]}" "$filter" || continue
        argv+=("--gtest_filter=$filter")
      fi
      run_one "$name" gtest "$timeout_s" "" -- "${argv[@]}"
    elif [[ "$kind" == exe ]]; then
      [[ -n "$filter" ]] && continue
      run_one "$name" exe "$timeout_s" "" -- "${argv[@]}"
    else
      [[ -n "$filter" ]] && continue
      run_one "$name" sh "$timeout_s" "" -- bash "${argv[@]}"
    fi
  done

  if ((gpus > 0)); then
    # Every binary's CUDA tests on two logical devices; the engine's equivalence and lock-step tests once more
    # on four (DP's chunks 2, 2, 2, 1 of a batch of 7). Each pass: label, mapping, which binaries.
    for pass in "2dev 0,0 *" "4dev 0,0,0,0 engine.*"; do
      read -r label mapping binaries <<<"$pass"
      say "== CUDA tests of $binaries on logical devices DPE_CUDA_LOGICAL_DEVICES=$mapping, filter $cuda_filter"
      for line in "${suite[@]}"; do
        IFS=$'\t' read -r -a f <<<"$line"
        # shellcheck disable=SC2053  # $binaries is a glob on purpose
        [[ "${f[1]}" == gtest && "${f[0]}" == $binaries ]] || continue
        [[ -z "$only" || "$only" == *",${f[0]},"* ]] || continue
        exe="$bundle/${f[2]}"
        has_tests "$exe" "$cuda_filter" || continue
        run_one "${f[0]}@$label" gtest "$timeout_s" "DPE_CUDA_LOGICAL_DEVICES=$mapping" -- "$exe" \
          "--gtest_filter=$cuda_filter"
      done
    done
  fi
fi

bench_rows=()
bench_fail=0
# run_bench NAME ENV_ASSIGNMENTS CMD...: output to logs/bench.NAME.log, its last lines to bench_tails.txt.
run_bench() {
  local name="$1" envs="$2"
  shift 2
  local remaining limit t0 rc
  [[ -n "$benches" && ! "$name" =~ $benches ]] && return
  remaining=$(left)
  if ((remaining <= 5)); then bench_rows+=("$name: NOT RUN (time budget spent)"); not_run+=("$name"); return; fi
  limit=$((remaining < 240 ? remaining : 240))
  t0=$SECONDS
  # shellcheck disable=SC2086
  env $envs timeout -k 10 "$limit" "$@" >"$results/logs/bench.$name.log" 2>&1
  rc=$?
  ((rc != 0)) && bench_fail=$((bench_fail + 1))
  bench_rows+=("$(printf '%-28s exit %3d in %4ds  %s' "$name" "$rc" "$((SECONDS - t0))" "${envs:+($envs)}")")
  printf '   %-44s exit %d in %ds\n' "bench $name" "$rc" "$((SECONDS - t0))" >&2
  { echo "--- $name ${envs:+($envs) }(exit $rc, $((SECONDS - t0))s); last lines:"; tail -25 "$results/logs/bench.$name.log"; } \
    >>"$results/bench_tails.txt"
}
if ((bench)); then
  say "== benchmarks"
  # The GPU benchmarks: the dpe tool's `bench` (single-device, DP and DDP mode on the same model, data and
  # batch; default devices: every CUDA device) and `collectives` (nccl-tests style bandwidth). On one GPU, the
  # @2dev rows run two logical devices on it: the multi-device code paths and their overhead, not scaling.
  if ((gpus > 0)) && [[ -x "$dpe_tool" ]]; then
    mkdir -p "$results/bench"
    # The language model at real size first: the 124M Llama in bfloat16, tokens/s and MFU against the GPU's
    # datasheet peak (core/peak_flops.h), single and DDP on the GPUs (docs/LANGUAGE_MODELS.md).
    run_bench "llama_124m_bf16" "" "$dpe_tool" bench --model llama --llama-preset 124m --modes single,ddp \
      --precision bf16 --batch-size 8 --steps "$bench_steps" --warmup "$bench_warmup" \
      --json "$results/bench/llama_124m_bf16.json"
    # Its attention alone, forward + backward: the fused kernels beside the composition, float32 and bfloat16,
    # multi-head and with 4 key/value heads (bench/attention_bench.cc).
    for kv in 12 4; do
      run_bench "attention_124m_kv$kv" "" "$bundle/bin/bench/bench.attention_bench" --device=cuda:0 --kv-heads=$kv
    done
    # Its memory on two logical devices of the first GPU: DDP against ZeRO-1 and ZeRO-2 (a half of the optimizer
    # state, and of the gradients, per device), with and without activation checkpointing; the table's memory
    # lines split each peak (docs/DATA_PARALLEL.md "Memory").
    for ac in "" "--activation-checkpointing"; do
      run_bench "llama_124m_bf16_zero@2dev${ac:+_ac}" "DPE_CUDA_LOGICAL_DEVICES=0,0" "$dpe_tool" bench --model llama \
        --llama-preset 124m --modes ddp,ddp-zero1,ddp-zero2 --precision bf16 --batch-size 8 --steps 5 --warmup 2 \
        $ac --json "$results/bench/llama_124m_bf16_zero@2dev${ac:+_ac}.json"
    done
    # Then dpe beside PyTorch, and training to an accuracy. PyTorch on the same GPU, models, data and batch: the machine's own torch, run by dpe bench --compare-pytorch through a
    # wrapper that gives it the machine's library path, not the bundle's. Its rows hold dpe's own.
    dpe_only_models=()
    torch_py=""
    for py in /opt/torch/.venv/bin/python3 "$(command -v python3)"; do
      if [[ -x "$py" ]] && LD_LIBRARY_PATH="$orig_ld" "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' \
        >/dev/null 2>&1; then torch_py=$py; break; fi
    done
    script="$here/../tools/bench/pytorch_reference.py"
    if [[ -n "$torch_py" && -f "$script" ]]; then
      printf '#!/bin/sh\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$orig_ld" "$torch_py" >"$results/torch_python"
      chmod 755 "$results/torch_python"
      # The 124M Llama in bfloat16 beside PyTorch's eager autocast and torch.compile on the same GPU, model and
      # batch (pytorch_reference.py's cuda-bf16 and cuda-bf16-compile: fused AdamW, flash attention through
      # F.scaled_dot_product_attention; the compilation falls in their warm-up steps).
      run_bench "llama_124m_bf16_vs_pytorch" "" "$dpe_tool" bench --model llama --llama-preset 124m --modes single \
        --precision bf16 --batch-size 8 --steps "$bench_steps" --warmup "$bench_warmup" --compare-pytorch \
        --pytorch-python "$results/torch_python" --pytorch-script "$script" \
        --pytorch-configs cuda-bf16,cuda-bf16-compile --json "$results/bench/llama_124m_bf16_vs_pytorch.json"
      # The CNN's second row measures cuDNN's algorithms (--cudnn-benchmark), as the PyTorch side does
      # (torch.backends.cudnn.benchmark = True).
      for ((round = 1; round <= rounds; round++)); do
        suffix=$( ((round > 1)) && echo ".r$round")
        for model in tiny-llama mlp cnn cnn_cudnn_benchmark; do
          extra=()
          [[ $model == cnn_cudnn_benchmark ]] && extra=(--cudnn-benchmark)
          run_bench "dpe_vs_pytorch_$model$suffix" "" "$dpe_tool" bench --model "${model%%_*}" --modes single,dp,ddp \
            --steps "$bench_steps" --warmup "$bench_warmup" "${extra[@]}" --compare-pytorch \
            --pytorch-python "$results/torch_python" --pytorch-script "$script" \
            --pytorch-configs cuda,dp --json "$results/bench/dpe_vs_pytorch_$model$suffix.json"
        done
      done
      # Where the backward spends its time on the GPU, node by node, and the CNN's phases
      # with every launch synchronous (CUDA_LAUNCH_BLOCKING=1: each phase's host time is then its GPU time plus
      # the launches, so a phase much longer there than in the normal row is GPU-bound).
      for model in tiny-llama cnn; do
        run_bench "profile_$model" "" "$dpe_tool" bench --model "$model" --modes single --device-ids cuda:0 \
          --profile --json "$results/bench/profile_$model.json"
      done
      run_bench "profile_cnn_cudnn_benchmark" "" "$dpe_tool" bench --model cnn --modes single --device-ids cuda:0 \
        --cudnn-benchmark --profile --json "$results/bench/profile_cnn_cudnn_benchmark.json"
      run_bench "cnn_launch_blocking" "CUDA_LAUNCH_BLOCKING=1" "$dpe_tool" bench --model cnn --modes single \
        --device-ids cuda:0 --json "$results/bench/cnn_launch_blocking.json"
      # Every kernel of the CNN's steps, dpe's and PyTorch's, with its GPU time (Nsight Compute, one metric, the
      # clocks left alone): 3 warm-up and 2 timed steps each, both measuring cuDNN's algorithms. ncu serialises
      # the kernels, so these say which kernels the GPU time goes to, not how long a step takes.
      ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      if [[ -n "$ncu" ]]; then
        ncu_args=("$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base)
        run_bench "kernels_cnn_dpe" "" "${ncu_args[@]}" --log-file "$results/bench/kernels_cnn_dpe.csv" \
          "$dpe_tool" bench --model cnn --modes single --device-ids cuda:0 --cudnn-benchmark --warmup 3 --steps 2
        run_bench "kernels_cnn_pytorch" "" "${ncu_args[@]}" --log-file "$results/bench/kernels_cnn_pytorch.csv" \
          "$results/torch_python" "$script" --model cnn --batch 256 --warmup 3 --steps 2 --configs cuda
        # One step of each, kernel by kernel (tools/gpu/kernel_table.py), into bench_tails.txt.
        csvs=()
        for side in dpe pytorch; do
          [[ -s "$results/bench/kernels_cnn_$side.csv" ]] && csvs+=("$results/bench/kernels_cnn_$side.csv")
        done
        if ((${#csvs[@]} > 0)); then
          LD_LIBRARY_PATH="$orig_ld" python3 "$here/../tools/gpu/kernel_table.py" "${csvs[@]}" \
            >"$results/bench/kernels_cnn.txt" 2>&1
          { echo "--- kernels_cnn: one step's kernels (GPU microseconds under ncu; all in bench/kernels_cnn.txt)"
            grep -E '^==|one step' "$results/bench/kernels_cnn.txt"; } >>"$results/bench_tails.txt"
        fi
      else
        bench_rows+=("kernels_cnn: NOT RUN (no ncu on this machine)")
      fi
      # The host's time per op on the GPU (the kernels queue behind it): what a host-bound step pays per launch.
      # The same binary runs on cpu:0 among the CPU benchmarks below.
      run_bench "op_overhead_cuda" "" "$bundle/bin/bench/bench.op_overhead_bench" --device=cuda:0
    else
      bench_rows+=("dpe_vs_pytorch: NOT RUN (no python3 whose torch sees the GPU, or no $script)")
      bench_fail=$((bench_fail + 1))
      dpe_only_models=(mlp cnn tiny-llama)
    fi
    # Training to an accuracy: the CNN for 2 epochs on cuda:0 and on two logical devices,
    # DP and DDP, each within 0.5 points of the same run on CPU devices.
    train_args=(train --model cnn --epochs 2)
    run_bench "train_cnn_cpu" "" "$dpe_tool" "${train_args[@]}" --mode ddp --cpu-devices 2 \
      --json "$results/bench/train_cnn_cpu.json"
    for mode in dp ddp; do
      run_bench "train_cnn_${mode}_cuda" "" "$dpe_tool" "${train_args[@]}" --mode "$mode" --device-ids cuda:0 \
        --json "$results/bench/train_cnn_${mode}_cuda.json"
      run_bench "train_cnn_${mode}_cuda@2dev" "DPE_CUDA_LOGICAL_DEVICES=0,0" "$dpe_tool" "${train_args[@]}" \
        --mode "$mode" --device-ids cuda:0,cuda:1 --json "$results/bench/train_cnn_${mode}_cuda@2dev.json"
    done
    # The accuracy check, unless --benches left every training run out.
    if [[ -z "$benches" || "train_cnn_cpu" =~ $benches ]] &&
      ! LD_LIBRARY_PATH="$orig_ld" python3 - "$results/bench" >>"$results/bench_tails.txt" 2>&1 <<'EOF'; then
import json, os, sys
d = sys.argv[1]
def accuracy(name):
    path = os.path.join(d, name + ".json")
    return json.load(open(path))["final_test_accuracy"] if os.path.exists(path) else None
cpu = accuracy("train_cnn_cpu")
print(f"--- dpe train --model cnn --epochs 2: final test accuracy, CPU devices (ddp): {cpu}")
bad = cpu is None
for mode in ("dp", "ddp"):
    for where in ("cuda", "cuda@2dev"):
        a = accuracy(f"train_cnn_{mode}_{where}")
        ok = a is not None and cpu is not None and abs(a - cpu) <= 0.005
        bad |= not ok
        print(f"    {mode} on {where}: {a} ({'within' if ok else 'NOT within'} 0.5 points of the CPU run)")
sys.exit(1 if bad else 0)
EOF
      bench_rows+=("train_cnn: an accuracy missing or not within 0.5 points of the CPU run (bench_tails.txt)")
      bench_fail=$((bench_fail + 1))
    fi
    for model in "${dpe_only_models[@]}"; do
      run_bench "dpe_bench_$model" "" "$dpe_tool" bench --model "$model" --modes single,dp,ddp \
        --json "$results/bench/dpe_bench_$model.json"
    done
    # Mixed precision (docs/MIXED_PRECISION.md): autocast's 16-bit GEMMs and fp16 with its gradient scaler.
    run_bench "dpe_bench_mlp_precisions" "" "$dpe_tool" bench --model mlp --modes single,ddp \
      --precision fp32,bf16,fp16 --json "$results/bench/dpe_bench_mlp_precisions.json"
    # ddp-no-sync: the two logical devices exchanging nothing, the bound dp and ddp are shown against.
    run_bench "dpe_bench_mlp@2dev" "DPE_CUDA_LOGICAL_DEVICES=0,0" "$dpe_tool" bench --model mlp \
      --modes single,dp,ddp,ddp-no-sync --json "$results/bench/dpe_bench_mlp@2dev.json"
    run_bench "dpe_collectives@2dev" "DPE_CUDA_LOGICAL_DEVICES=0,0" "$dpe_tool" collectives \
      --json "$results/bench/dpe_collectives@2dev.json"
  elif [[ -x "$dpe_tool" ]]; then
    say "   (no GPU: the dpe bench / dpe collectives GPU benchmarks are not run)"
  fi
  # The auto split on two CPU devices that are unequal without sharing a core (2 cores against 6: the
  # development VMs can only time-share one), where the machine has the cores: the even split, then auto.
  if (($(nproc) >= 8)) && [[ -x "$dpe_tool" ]]; then
    for split in chunk auto; do
      run_bench "auto_split_2v6_cores_$split" "DPE_NUM_CPU_DEVICES=2 DPE_CPU_DEVICE_CORES=0,1;2,3,4,5,6,7" \
        "$dpe_tool" bench --model cnn --modes dp,ddp --device-ids cpu:0,cpu:1 --batch-size 256 --steps 30 \
        --warmup 12 --split "$split" --json "$results/bench/auto_split_2v6_cores_$split.json"
    done
  fi
  # The CPU benchmarks (bin/bench/*) last: with a GPU, what only the GPU machine can run comes first in the budget.
  for exe in "$bundle"/bin/bench/*; do
    [[ -f "$exe" ]] && run_bench "$(basename "$exe")" "" "$exe"
  done
fi

san_ran=0
if ((sanitizer)); then
  cs=""
  for c in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
    /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    if command -v "$c" >/dev/null 2>&1; then cs=$(command -v "$c"); break; fi
  done
  if [[ -z "$cs" ]]; then
    say "== compute-sanitizer not found: sanitizer runs skipped"
  elif ((gpus == 0)); then
    say "== no GPU: sanitizer runs skipped"
  else
    san_ran=1
    say "== compute-sanitizer ($cs; $("$cs" --version 2>/dev/null | grep -i version | head -1)), tools $san_tools, filter $cuda_filter"
    # --report-api-errors no: tests provoke CUDA errors on purpose (out-of-memory); dpe checks every call
    # itself. Left out for the same reason: the deliberate 1 PiB allocation and the planted illegal address.
    san_filter="$cuda_filter-*OutOfMemory*:*StickyCudaError*"
    IFS=',' read -r -a tool_list <<<"$san_tools"
    for tool in "${tool_list[@]}"; do
      for line in "${suite[@]}"; do
        IFS=$'\t' read -r -a f <<<"$line"
        [[ "${f[1]}" == gtest ]] || continue
        [[ -z "$only" || "$only" == *",${f[0]},"* ]] || continue
        # racecheck and synccheck look inside kernels (shared memory, __syncthreads), 10-100x slower than the
        # run itself: the core and collectives tests, which run every CUDA kernel dpe has (the parity tests),
        # are theirs; the engine's and layers' tests only compose the same kernels (memcheck runs them all).
        [[ "$tool" == memcheck || "${f[0]}" == core.* || "${f[0]}" == collectives.* ]] || continue
        exe="$bundle/${f[2]}"
        has_tests "$exe" "$san_filter" || continue
        run_one "${f[0]}@$tool" san "$san_timeout_s" "DPE_CUDA_LOGICAL_DEVICES=0,0" -- \
          "$cs" --tool "$tool" --report-api-errors no --print-limit 50 "$exe" "--gtest_filter=$san_filter"
      done
    done
  fi
fi

# --- summary ------------------------------------------------------------------------------------------------
# summary.txt gets every list in full; the console (whose tail is what a device call returns) at most 25 lines
# of each, so that the table and the closing line always fit.
print_list() {  # print_list TITLE MAX ITEMS...
  local title="$1" max="$2"
  shift 2
  (($# == 0)) && return
  echo
  echo "$title ($#):"
  local i=0
  for item in "$@"; do
    if ((i == max)); then echo "  ... $(($# - max)) more in summary.txt"; break; fi
    echo "  $item"
    i=$((i + 1))
  done
}
report() {  # report MAX_LIST_LINES
  echo
  echo "== summary ($((SECONDS - start))s; budget ${budget}s; $gpus GPU(s))"
  printf '%-44s %6s %6s %6s %7s  %s\n' "run" passed failed skipped time status
  ((${#rows[@]} > 0)) && printf '%s\n' "${rows[@]}"
  if ((${#bench_rows[@]} > 0)); then
    echo
    echo "benchmarks (last lines of their output: end of summary.txt; in full: logs/bench.*.log):"
    printf '  %s\n' "${bench_rows[@]}"
  fi
  print_list "failed" "$1" "${fail_cases[@]}"
  print_list "skipped" "$1" "${skip_cases[@]}"
  print_list "not run, time budget spent" "$1" "${not_run[@]}"
  ((sanitizer && !san_ran)) && echo "sanitizer: requested but not run (see above)"
  echo
  echo "$total_pass passed, $total_fail failed, $total_skip skipped${not_run[0]:+, ${#not_run[@]} not run (time budget spent)}"
}
report 1000000 >>"$summary"
report 25
[[ -f "$results/bench_tails.txt" ]] && { echo; cat "$results/bench_tails.txt"; } >>"$summary"

if [[ -n "$out_dir" ]]; then
  mkdir -p "$out_dir"
  cp "$summary" "$out_dir/summary.txt"
  tar -czf "$out_dir/logs.tar.gz" -C "$results" --exclude=tmp . 2>/dev/null
  echo "run_suite: wrote $out_dir/summary.txt and $out_dir/logs.tar.gz ($(du -h "$out_dir/logs.tar.gz" | cut -f1))"
fi

# Not run is not passed: an incomplete run exits non-zero too.
((total_fail == 0 && bench_fail == 0 && ${#not_run[@]} == 0))
