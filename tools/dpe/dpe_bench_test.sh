#!/usr/bin/env bash
# `dpe bench` runs every mode on the same batch and writes one row per mode to the table, CSV and JSON.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
# --cpu-devices 2 throughout: CPU devices also where there is a GPU (the CPU GEMM choice, CPU device names).
out=$(DPE_CPU_SGEMM=auto "$bin" bench --model mlp --cpu-devices 2 --batch-size 64 --steps 2 --warmup 1 \
      --modes single,single-all,dp,ddp,auto,ddp-no-sync \
      --csv "$tmp/b.csv" --json "$tmp/b.json" 2>&1) || { echo "FAILED: $out"; exit 1; }
echo "$out"
# auto's row names the mode it chose
rows=$(grep -cE '^dpe +(single|single-all|dp|ddp|auto->dp|auto->ddp|ddp-no-sync) ' <<<"$out")
[[ $rows -eq 6 ]] || { echo "FAILED: $rows table rows (want 6)"; fail=1; }
[[ $(wc -l < "$tmp/b.csv") -eq 7 ]] || { echo "FAILED: CSV lines"; fail=1; }
# ddp-no-sync bounds the others: each 2-device row as a share of it.
grep -qE '^# dpe ddp-no-sync exchanges nothing, the most data parallelism gets from these devices: dp [0-9]+%, ddp [0-9]+%, auto->d?dp [0-9]+% of it$' \
  <<<"$out" || { echo "FAILED: no line of shares of ddp-no-sync"; fail=1; }
python3 - "$tmp/b.json" <<'PY' || fail=1
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["config"] for r in rows][:4] == ["single", "single-all", "dp", "ddp"], rows
assert rows[4]["config"] in ("auto->dp", "auto->ddp"), rows
# ddp-no-sync runs DDP's phases but reduces nothing; ddp does reduce.
no_sync = rows[5]
assert no_sync["config"] == "ddp-no-sync" and no_sync["devices"] == 2, no_sync
assert no_sync["phases_ms"]["backward"] > 0 and no_sync["phases_ms"]["optimizer"] > 0, no_sync
assert no_sync["phases_ms"]["reduce"] == 0 and rows[3]["phases_ms"]["reduce"] > 0, rows
for r in rows:
    assert r["samples_per_s"] > 0 and r["step_ms"] > 0, r
ddp = rows[3]
assert ddp["phases_ms"]["backward"] > 0 and ddp["devices"] == 2, ddp
PY
# The FMA-peak limit: measured with the widest vectors the CPU has (the ISA is named), or DPE_PEAK_GFLOPS.
grep -qE '^# FMA-peak limit: [0-9]+ samples/s \((AVX2|AVX-512) FMA probe on ([0-9]+ CPUs at once: [0-9.]+-[0-9.]+ GFLOP/s each, |1 CPU: )[0-9.]+ GFLOP/s' \
  <<<"$out" || { echo "FAILED: no measured FMA-peak limit line"; fail=1; }
# The instruction set dpe ran, and under DPE_MAX_CPU_ISA=avx2 (this test's capped run) an AVX2 limit whatever
# the CPU has (Note [The CPU instruction-set cap], core/cpu_isa.h).
grep -qE '^# CPU instruction set: (avx2|avx512|avx512_bf16) \(' <<<"$out" || { echo "FAILED: no CPU instruction set line"; fail=1; }
if [[ ${DPE_MAX_CPU_ISA:-} == avx2 ]]; then
  grep -qE '^# CPU instruction set: avx2 \((the CPU.s own|DPE_MAX_CPU_ISA=avx2 on an avx512(_bf16)? CPU)\)$' <<<"$out" ||
    { echo "FAILED: the avx2 cap is not the instruction set"; fail=1; }
  grep -qE '^# FMA-peak limit: [0-9]+ samples/s \(AVX2 FMA probe' <<<"$out" || { echo "FAILED: not an AVX2 FMA limit"; fail=1; }
fi
# Which library ran each float32 GEMM shape, measured under DPE_CPU_SGEMM=auto (core/kernels/sgemm_choice.h).
grep -qE '^#   m 64 n 512 k 784 B\^T, [0-9]+ threads?: (onednn-sgemm|onednn-matmul|openblas) \(onednn-sgemm [0-9]+, ' <<<"$out" ||
  { echo "FAILED: no float32 GEMM choice for the MLP's first layer"; fail=1; }
# Every CPU of the affinity mask at once, and only those: under taskset one CPU is probed, whatever the machine has.
out=$(taskset -c "$(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')" "$bin" bench --model mlp \
      --cpu-devices 1 --batch-size 16 --steps 1 --warmup 0 --modes single 2>&1) || { echo "FAILED: taskset: $out"; fail=1; }
grep -qE '^# FMA-peak limit: [0-9]+ samples/s \((AVX2|AVX-512) FMA probe on 1 CPU: [0-9.]+ GFLOP/s / ' <<<"$out" ||
  { echo "FAILED: under taskset, the FMA probe did not run on exactly one CPU: $out"; fail=1; }
# On a CUDA device the table ends with its rows: the CPU's FMA peak and GEMM choices say nothing about a GPU.
if "$bin" devices 2>/dev/null | grep -qE '^ +cuda:0 '; then
  out=$("$bin" bench --model mlp --device-ids cuda:0 --batch-size 64 --steps 2 --warmup 1 --modes single 2>&1) ||
    { echo "FAILED: $out"; fail=1; }
  if grep -qE '^# (FMA-peak|float32 GEMM)' <<<"$out"; then echo "FAILED: CPU lines in a cuda:0 table: $out"; fail=1; fi
fi
# A device pinned by DPE_CPU_DEVICE_CORES runs the one-device row on its cores only, as its engine worker would.
# The first CPU this test may run on (a cpuset need not hold CPU 0).
core=$(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')
out=$(DPE_NUM_CPU_DEVICES=2 DPE_CPU_DEVICE_CORES=";$core" "$bin" bench --model mlp --device-ids cpu:1 --batch-size 16 \
      --steps 1 --warmup 0 --modes single 2>&1) || { echo "FAILED: pinned single: $out"; fail=1; }
grep -q "^bench: single runs on core(s) $core (DPE_CPU_DEVICE_CORES), 1 intra-op thread(s)\$" <<<"$out" ||
  { echo "FAILED: the pinned device's single row is not on core $core: $out"; fail=1; }
# --split auto: the weights it settled on and each device's time per sample, in the table's notes and the JSON.
out=$("$bin" bench --model mlp --cpu-devices 2 --batch-size 64 --steps 6 --warmup 3 --modes ddp --split auto --json "$tmp/split.json" 2>&1) ||
  { echo "FAILED: --split auto: $out"; fail=1; }
grep -qE '^# ddp split auto:  cpu:0 0\.[0-9]+ \([0-9.]+ ms/sample\)  cpu:1 ' <<<"$out" || { echo "FAILED: no split line: $out"; fail=1; }
python3 - "$tmp/split.json" <<'PY' || { echo "FAILED: the --split auto JSON"; fail=1; }
import json, sys
row = json.load(open(sys.argv[1]))["rows"][0]
assert len(row["split_weights"]) == 2 and abs(sum(row["split_weights"]) - 1) < 1e-3, row
assert all(t > 0 for t in row["ms_per_sample"]), row
PY
# --repeat: every row in each of 3 interleaved rounds; a row is its median round, its scaling the median of the
# rounds' own, and every round is listed (table and JSON).
out=$("$bin" bench --model mlp --cpu-devices 2 --batch-size 32 --steps 2 --warmup 1 --modes single,ddp --repeat 3 \
      --json "$tmp/repeat.json" 2>&1) || { echo "FAILED: --repeat: $out"; fail=1; }
[[ $(grep -cE '^bench: mlp (single|ddp) on cpu:0 cpu:1, round [123] of 3\.\.\.$' <<<"$out") -eq 6 ]] ||
  { echo "FAILED: not 3 interleaved rounds of 2 rows: $out"; fail=1; }
grep -qE '^# dpe bench: mlp, .*, the median of 3 rounds$' <<<"$out" || { echo "FAILED: no median header: $out"; fail=1; }
grep -qE '^#   dpe ddp: [0-9]+, [0-9]+, [0-9]+ samples/s; scaling [0-9]+%, [0-9]+%, [0-9]+%$' <<<"$out" ||
  { echo "FAILED: no line of ddp's rounds: $out"; fail=1; }
python3 - "$tmp/repeat.json" <<'PY' || { echo "FAILED: the --repeat JSON"; fail=1; }
import json, sys
report = json.load(open(sys.argv[1]))
assert report["repeat"] == 3, report
for row in report["rows"]:
    rounds = row["rounds"]
    assert len(rounds) == 3 and all(r["config"] == row["config"] for r in rounds), row
    assert row["samples_per_s"] == sorted(r["samples_per_s"] for r in rounds)[1], row
    assert row["scaling"] == sorted(r["scaling"] for r in rounds)[1], row
PY
# --profile: each mode's backward by node kind, after its timed steps; the shares add up to the total, and the
# JSON row has the same nodes. tiny-llama's backward has attention's (fused on CPU) and the embedding's scatter-add.
out=$("$bin" bench --model tiny-llama --cpu-devices 2 --batch-size 16 --steps 2 --warmup 1 --modes single,dp,ddp --profile \
      --json "$tmp/profile.json" 2>&1) || { echo "FAILED: --profile: $out"; fail=1; }
for mode in single dp ddp; do
  grep -qE "^# $mode backward by node on cpu:0.*, per step \(2 profiled steps after the timed ones; wall time\)" <<<"$out" ||
    { echo "FAILED: no $mode profile header: $out"; fail=1; }
done
for node in ScaledDotProductAttentionBackward EmbeddingBackward MatmulBackward; do
  [[ $(grep -cE "^$node +[0-9.]+ +[0-9.]+ +[0-9.]+%" <<<"$out") -eq 3 ]] || { echo "FAILED: $node not in every profile"; fail=1; }
done
python3 - "$tmp/profile.json" <<'PY' || { echo "FAILED: the --profile JSON"; fail=1; }
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    nodes = {n["node"]: n for n in row["backward_profile"]}
    # one per layer and device: a table sums its devices
    assert nodes["ScaledDotProductAttentionBackward"]["calls_per_step"] == 2 * row["devices"], row
    # DP's gather runs the replicas' backward passes, whose nodes are timed: it is not timed around them too
    assert "DataParallelGatherBackward" not in nodes, row
    assert sum(n["ms_per_step"] for n in nodes.values()) > 0, row
PY
if "$bin" devices 2>/dev/null | grep -qE '^ +cuda:0 '; then
  out=$("$bin" bench --model tiny-llama --device-ids cuda:0 --batch-size 16 --steps 2 --warmup 1 --modes single --profile 2>&1) ||
    { echo "FAILED: --profile on cuda:0: $out"; fail=1; }
  grep -qE '^# single backward by node on cuda:0, per step .*stream time' <<<"$out" && grep -qE '^SoftmaxBackward ' <<<"$out" ||
    { echo "FAILED: no cuda:0 profile: $out"; fail=1; }
fi
# expect STATUS PATTERN ARGS...: `dpe bench ARGS` exits with STATUS within 30 s, output containing PATTERN.
expect() {
  local want_status="$1" pattern="$2"; shift 2
  out=$(cd "$tmp" && timeout 30 "$bin" bench "$@" 2>&1)
  local status=$?
  if [[ $status -ne $want_status ]] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAILED: dpe bench $* -> status $status (want $want_status, 124 = timed out), want '$pattern', output:"
    echo "$out" | tail -5
    fail=1
  fi
}
bin=$(realpath "$bin")
# CPU devices also where there is a GPU: the FMA-peak and GEMM lines below describe CPU devices only.
quick=(--model mlp --cpu-devices 1 --batch-size 32 --steps 1 --warmup 0 --modes single)

# No shell anywhere: a --png path with a quote, $(...), backquotes and ';' is just a file name. gnuplot gets
# its script on stdin and the PNG comes back on its stdout, so the path never enters gnuplot's language
# either. Nothing runs: no "pwned" file appears. Without gnuplot the error is clean.
nasty="a'b\$(touch pwned1)\`touch pwned2\`;touch pwned3'.png"
out=$(cd "$tmp" && "$bin" bench "${quick[@]}" --png "$nasty" --json "x'\$(touch pwned4).json" 2>&1)
status=$?
if command -v gnuplot >/dev/null; then
  if [[ $status -ne 0 ]] || ! head -c 4 "$tmp/$nasty" | grep -q PNG; then
    echo "FAILED: --png with a quote: status $status, no PNG: $out"; fail=1
  else
    echo "--png with a quote and \$(...): PNG written"
  fi
  [[ -s "$tmp/x'\$(touch pwned4).json" ]] || { echo "FAILED: no JSON"; fail=1; }
elif [[ $status -ne 2 ]] || ! grep -q "needs gnuplot" <<<"$out"; then
  echo "FAILED: --png without gnuplot: status $status, $out"; fail=1
fi
ls "$tmp" | grep -q "^pwned" && { echo "FAILED: a command ran: $(ls "$tmp")"; fail=1; }
# gnuplot's `set output '|cmd'` would pipe into a command: a path starting with '|' is a plain file here.
out=$(cd "$tmp" && "$bin" bench "${quick[@]}" --png "|touch pwned5" 2>&1)
ls "$tmp" | grep -q "^pwned" && { echo "FAILED: a command ran: $(ls "$tmp")"; fail=1; }
# The PyTorch script path and configurations reach python3 as arguments, never through a shell: a stand-in
# script at a path with a quote and $(...) prints two rows, the second with a quote in its configuration: dpe
# reads the rows with nlohmann-json, so the configuration arrives whole ('a"b'), and the --json report escapes
# it (hand-written JSON once wrote "a\", no valid JSON).
script="$tmp/it's \$(touch pwned6).py"
cat > "$script" <<'PY'
import json, sys
assert sys.argv[sys.argv.index("--configs") + 1] == "single-3t,ddp-gloo", sys.argv
print(json.dumps({"framework": "pytorch", "config": "single-3t", "processes": 1, "samples_per_s": 123.0, "step_ms": 4.5,
                  "peak_rss_bytes": [100000000]}))
print(json.dumps({"framework": "pytorch", "config": 'a"b', "processes": 1, "samples_per_s": 1.0, "step_ms": 1.0}))
PY
if [[ -x /usr/bin/python3 ]]; then
  expect 0 "peak RSS MB: process 0 100.0" "${quick[@]}" --compare-pytorch --pytorch-script "$script" \
    --pytorch-configs single-3t,ddp-gloo --json "$tmp/p.json"
  python3 -c 'import json, sys; c = [r["config"] for r in json.load(open(sys.argv[1]))["rows"]]; assert "a\"b" in c, c' \
    "$tmp/p.json" || { echo "FAILED: the --json report of a configuration with a quote"; fail=1; }
  python3 -c 'import json, sys; r = [r for r in json.load(open(sys.argv[1]))["rows"] if r["config"] == "single-3t"]
assert r[0]["peak_rss_bytes"] == [100000000], r' "$tmp/p.json" || { echo "FAILED: PyTorch's peak RSS in --json"; fail=1; }
  # PyTorch's ddp-gloo against its own no-sync row, as dpe's rows against theirs.
  bound="$tmp/bound.py"
  cat > "$bound" <<'PY'
import json
for config, rate in (("ddp-gloo", 50.0), ("ddp-gloo-no-sync", 200.0)):
    print(json.dumps({"framework": "pytorch", "config": config, "processes": 2, "samples_per_s": rate, "step_ms": 1.0}))
PY
  expect 0 "# pytorch ddp-gloo-no-sync exchanges nothing, the most data parallelism gets from these devices: ddp-gloo 25% of it" \
    "${quick[@]}" --compare-pytorch --pytorch-script "$bound" --pytorch-configs ddp-gloo,ddp-gloo-no-sync
  # A GPU row's memory: the caching allocator's peak, in the table and the --json report.
  gpu_row="$tmp/gpu_row.py"
  cat > "$gpu_row" <<'PY'
import json
print(json.dumps({"framework": "pytorch", "config": "cuda-bf16-compile", "processes": 1, "samples_per_s": 9.0,
                  "step_ms": 2.0, "peak_cuda_bytes": 2000000000}))
PY
  expect 0 "peak CUDA MB: 2000.0" "${quick[@]}" --compare-pytorch --pytorch-script "$gpu_row" \
    --pytorch-configs cuda-bf16-compile --json "$tmp/g.json"
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["rows"][-1]
assert r["peak_cuda_bytes"] == 2000000000, r' "$tmp/g.json" || { echo "FAILED: PyTorch's CUDA peak in --json"; fail=1; }
  # --pytorch-python: the interpreter is run directly, whatever its path holds.
  python_link="$tmp/py \$(touch pwned9)"
  ln -s /usr/bin/python3 "$python_link"
  expect 0 "pytorch  single-3t" "${quick[@]}" --compare-pytorch --pytorch-python "$python_link" \
    --pytorch-script "$script" --pytorch-configs single-3t,ddp-gloo
  ls "$tmp" | grep -q "^pwned" && { echo "FAILED: a command ran: $(ls "$tmp")"; fail=1; }
fi
expect 2 "--pytorch-python $tmp/none: not an executable file" "${quick[@]}" --compare-pytorch \
  --pytorch-script "$script" --pytorch-python "$tmp/none"
# Bad PyTorch configurations are refused at start-up, naming the value and the known ones.
expect 2 "--pytorch-configs 'frob': unknown configuration; expected single, single-Nt (N >= 1 threads), cuda, cuda-bf16, cuda-bf16-compile, dp, ddp-gloo or ddp-gloo-no-sync" \
  "${quick[@]}" --compare-pytorch --pytorch-configs single-1t,frob
expect 2 "--pytorch-configs 'single-0t': unknown configuration" "${quick[@]}" --compare-pytorch --pytorch-configs single-0t
expect 2 "--pytorch-configs 'ddp-gloo;touch pwned7': unknown configuration" "${quick[@]}" --compare-pytorch \
  --pytorch-configs "ddp-gloo;touch pwned7"
expect 2 "--pytorch-configs 'single-1t\$(touch pwned8)': unknown configuration" "${quick[@]}" --compare-pytorch \
  --pytorch-configs 'single-1t$(touch pwned8)'
expect 2 "--pytorch-script $tmp/none.py: no such file" "${quick[@]}" --compare-pytorch --pytorch-script "$tmp/none.py"
# The real reference script on every model, where Debian's python3-torch is installed (CI leaves it out).
reference="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/tools/bench/pytorch_reference.py"
if [[ -f "$reference" ]] && /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  for model in mlp cnn tiny-llama; do
    expect 0 "pytorch  single-1t" --model "$model" --cpu-devices 1 --batch-size 16 --steps 1 --warmup 0 --modes single \
      --compare-pytorch --pytorch-script "$reference" --pytorch-configs single-1t
  done
  expect 0 "pytorch  ddp-gloo-no-sync" --model mlp --cpu-devices 1 --batch-size 16 --steps 1 --warmup 0 --modes single \
    --compare-pytorch --pytorch-script "$reference" --pytorch-configs ddp-gloo-no-sync
  # --model llama: the script gets the preset, the resolved sequence length and the vocabulary, builds the same
  # model on random tokens, and its rows get tokens/s and MFU as dpe's do.
  out=$("$bin" bench --model llama --llama-preset tiny --seq-len 16 --cpu-devices 1 --batch-size 4 --steps 2 --warmup 1 \
        --modes single --compare-pytorch --pytorch-script "$reference" --pytorch-configs single-1t,ddp-gloo 2>&1) ||
    { echo "FAILED: --model llama --compare-pytorch: $out"; fail=1; }
  grep -qE '^running PyTorch: .* --model llama .*--llama-preset tiny --seq-len 16 --vocab 259( |$)' <<<"$out" ||
    { echo "FAILED: the llama preset, sequence length and vocabulary not passed: $out"; fail=1; }
  [[ $(grep -cE '^#   (dpe single|pytorch single-1t|pytorch ddp-gloo): [0-9]+ tokens/s, MFU [0-9.]+%$' <<<"$out") -eq 3 ]] ||
    { echo "FAILED: not every llama row has tokens/s and MFU: $out"; fail=1; }
else
  echo "note: pytorch_reference.py itself not run (no $reference, or no torch for /usr/bin/python3)"
fi
expect 107 "--pytorch-configs requires --compare-pytorch" --pytorch-configs dp
expect 107 "--pytorch-script requires --compare-pytorch" --pytorch-script "$script"
ls "$tmp" | grep -q "^pwned" && { echo "FAILED: a command ran: $(ls "$tmp")"; fail=1; }
# Outputs are checked before benchmarking.
export DPE_PEAK_GFLOPS=100
expect 0 "samples/s (100.0 GFLOP/s from DPE_PEAK_GFLOPS / 3.21 MFLOP per sample)" "${quick[@]}"
for bad in abc 0 -5 '' 1e999 '100 '; do
  export DPE_PEAK_GFLOPS="$bad"
  expect 2 "DPE_PEAK_GFLOPS='$bad' is not a positive number of GFLOP/s" "${quick[@]}"
done
unset DPE_PEAK_GFLOPS
expect 0 "# float32 GEMM: onednn (the default): oneDNN's matmul primitive for A @ B^T of >= 2e+07 FLOP (Linear's forward), dnnl_sgemm for the rest; DPE_CPU_SGEMM=auto measures each shape" \
  "${quick[@]}"
export DPE_CPU_SGEMM=openblas
expect 0 "# float32 GEMM: openblas for every shape (DPE_CPU_SGEMM; DPE_CPU_SGEMM=auto measures each shape)" \
  "${quick[@]}"
export DPE_CPU_SGEMM=fastest
expect 2 "DPE_CPU_SGEMM='fastest' is not a float32 GEMM policy; expected onednn, auto, onednn-sgemm, onednn-matmul or openblas" \
  "${quick[@]}"
unset DPE_CPU_SGEMM
expect 2 "--json $tmp/no/b.json: the directory $tmp/no does not exist" "${quick[@]}" --json "$tmp/no/b.json"
expect 2 "--csv $tmp: is a directory" "${quick[@]}" --csv "$tmp"
expect 2 "--png $tmp/no/b.png: the directory $tmp/no does not exist" "${quick[@]}" --png "$tmp/no/b.png"
expect 2 "--png $tmp/: names a directory" "${quick[@]}" --png "$tmp/"
# No gnuplot: refused at start-up, before benchmarking (it used to fail after the runs).
out=$(cd "$tmp" && PATH=/nonexistent "$bin" bench "${quick[@]}" --png "$tmp/p.png" 2>&1)
status=$?
if [[ $status -ne 2 ]] || ! grep -qF -- "--png $tmp/p.png: needs gnuplot, which is not on PATH" <<<"$out" \
   || grep -q "^dpe  *single" <<<"$out"; then
  echo "FAILED: --png without gnuplot -> status $status: $out"; fail=1
fi
# Sizes.
expect 2 "--batch-size 70000 is larger than the 60000 training samples of mlp" --model mlp --batch-size 70000 --steps 1 \
  --warmup 0 --modes single
expect 2 "--batch-size 0: expected an integer in [1, 2^31]" --batch-size 0
expect 2 "--batch-size 99999999999999999999999: expected an integer in [1, 2^31]" --batch-size 99999999999999999999999
expect 2 "--steps 0: expected an integer in [1, 1000000]" --steps 0
expect 2 "--steps 1e3: expected an integer in [1, 1000000]" --steps 1e3
expect 2 "--warmup -1: expected an integer in [0, 1000000]" --warmup -1
expect 2 "--repeat 0: expected an integer in [1, 1000]" --repeat 0
expect 2 "--cpu-devices 0: expected an integer in [1, 1024]" --cpu-devices 0
expect 2 "--cpu-devices 2000: expected an integer in [1, 1024]" --cpu-devices 2000
expect 2 "--batch-size 4 splits into 2 shards (2, 2) for 3 DDP devices" --cpu-devices 3 --batch-size 4 --modes single,ddp
expect 2 "--device-ids '': expected at least one device" --device-ids ""
expect 2 "--device-ids 'cpu:0,,cpu:1': item 2 is empty" --device-ids cpu:0,,cpu:1
expect 2 "--device-ids: cpu:4096 does not exist" --device-ids cpu:0,cpu:4096
expect 2 "--device-ids lists cpu:0 more than once (items 1 and 2)" --device-ids cpu:0,cpu:0
expect 2 "--modes 'frob': item 1 'frob' is not one of single,single-all,dp,ddp,ddp-no-sync,auto,ddp-zero1,ddp-zero2" --modes frob
expect 105 "--split: frob not in {chunk,balanced,auto}" --split frob
expect 2 "--modes ddp,ddp-no-sync with --deterministic: ddp-no-sync has no deterministic form (the deterministic step reduces every backward)" \
  --modes ddp,ddp-no-sync --deterministic
expect 2 "--modes 'single,,dp': item 2 is empty" --modes single,,dp
expect 2 "--modes 'single,': item 2 is empty" --modes single,
expect 105 "--model: resnet not in" --model resnet
expect 2 "--channels-last: the tiny-llama model's inputs are token ids (N, T), not images" --model tiny-llama --channels-last
# --channels-last: its rows say so.
out=$("$bin" bench --model cnn --cpu-devices 2 --batch-size 16 --steps 1 --warmup 1 --modes single,ddp --channels-last \
      --json "$tmp/cl.json" 2>&1) || { echo "FAILED: --channels-last: $out"; fail=1; }
[[ $(grep -cE '^dpe +(single|ddp)-cl ' <<<"$out") -eq 2 ]] || { echo "FAILED: no -cl rows: $out"; fail=1; }
# Their scaling is against the single-cl row (it was 0 while the lookup wanted a row named "single").
python3 - "$tmp/cl.json" <<'PY' || { echo "FAILED: no scaling for ddp-cl"; fail=1; }
import json, sys
rows = {r["config"]: r for r in json.load(open(sys.argv[1]))["rows"]}
assert rows["ddp-cl"]["scaling"] > 0, rows
PY
# Without a single row there is nothing to scale against: "-" and null, not 0% (as it was).
out=$("$bin" bench --model mlp --cpu-devices 2 --batch-size 16 --steps 1 --warmup 1 --modes ddp --json "$tmp/ddp.json" \
      --csv "$tmp/ddp.csv" 2>&1) || { echo "FAILED: --modes ddp: $out"; fail=1; }
grep -qE '^dpe +ddp +2 +[0-9]+ +- ' <<<"$out" || { echo "FAILED: no '-' scaling without a single row: $out"; fail=1; }
python3 - "$tmp/ddp.json" "$tmp/ddp.csv" <<'PY' || { echo "FAILED: scaling without a single row is not null/empty"; fail=1; }
import csv, json, sys
assert json.load(open(sys.argv[1]))["rows"][0]["scaling"] is None
assert next(csv.DictReader(open(sys.argv[2])))["scaling"] == ""
PY
# --model llama: a preset on random tokens; every row has tokens/s and MFU, in the table and the JSON.
out=$("$bin" bench --model llama --llama-preset tiny --seq-len 16 --cpu-devices 2 --batch-size 4 --steps 2 --warmup 1 \
      --modes single,ddp --json "$tmp/llama.json" 2>&1) || { echo "FAILED: --model llama: $out"; fail=1; }
[[ $(grep -cE '^#   dpe (single|ddp): [0-9]+ tokens/s, MFU [0-9.]+%$' <<<"$out") -eq 2 ]] || {
  echo "FAILED: no tokens/s and MFU lines: $out"; fail=1; }
python3 - "$tmp/llama.json" <<'PY' || { echo "FAILED: llama rows without tokens_per_s / mfu"; fail=1; }
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    assert abs(float(r["tokens_per_s"]) - 16 * float(r["samples_per_s"])) < 1e-3 * float(r["tokens_per_s"]), r
    assert 0 < float(r["mfu"]) < 2, r
PY
expect 2 "--seq-len 100 is longer than the tiny preset's 64 positions" --model llama --llama-preset tiny --seq-len 100
# ZeRO rows and the memory split at each device's peak, as the allocator tagged it: on 4 devices ZeRO-1 keeps a
# quarter of DDP's optimizer state per device, ZeRO-2 also far fewer gradients; DP's first device holds the
# optimizer alone; the parts add up to the peak. Activation checkpointing: rows -ac.
out=$("$bin" bench --model llama --llama-preset tiny --seq-len 16 --cpu-devices 4 --batch-size 8 --steps 1 --warmup 1 \
      --modes dp,ddp,ddp-zero1,ddp-zero2 --optimizer adam --json "$tmp/zero.json" 2>&1) || { echo "FAILED: zero: $out"; fail=1; }
[[ $(grep -cE '^#   (dp|ddp|ddp-zero1|ddp-zero2)  cpu:0 [0-9.]+ = ' <<<"$out") -eq 4 ]] || {
  echo "FAILED: no memory line per row: $out"; fail=1; }
python3 - "$tmp/zero.json" <<'PY' || { echo "FAILED: ZeRO's memory split"; fail=1; }
import json, sys
report = {r["config"]: r for r in json.load(open(sys.argv[1]))["rows"]}
rows = {config: r["memory_bytes"] for config, r in report.items()}
ddp, z1, z2, dp = rows["ddp"], rows["ddp-zero1"], rows["ddp-zero2"], rows["dp"]
for d in ("cpu:0", "cpu:1", "cpu:2", "cpu:3"):
    # A quarter, give or take each piece's rounded blocks (and the step's temporaries, were the peak in it).
    quarter = lambda x: -2048 <= 4 * x - ddp[d]["optimizer_state"] <= 0.2 * ddp[d]["optimizer_state"]
    assert quarter(z1[d]["optimizer_state"]) and quarter(z2[d]["optimizer_state"]), (d, ddp[d], z1[d], z2[d])
    assert 2 * z2[d]["gradients"] < ddp[d]["gradients"] and z2[d]["gradients"] < z1[d]["gradients"], (d, z2[d], ddp[d])
    assert z1[d]["parameters"] == z2[d]["parameters"] == ddp[d]["parameters"] == dp[d]["parameters"] > 0, d
    assert (dp[d]["optimizer_state"] > 0) == (d == "cpu:0"), (d, dp[d])
    for config, parts in rows.items():
        assert sum(parts[d].values()) == report[config]["peak_bytes"][d], (config, d, parts[d])
PY
out=$("$bin" bench --model cnn --cpu-devices 2 --batch-size 16 --steps 1 --warmup 1 --modes ddp-zero2 \
      --activation-checkpointing 2>&1) || { echo "FAILED: --activation-checkpointing: $out"; fail=1; }
grep -qE '^dpe +ddp-zero2-ac +2 ' <<<"$out" || { echo "FAILED: no ddp-zero2-ac row: $out"; fail=1; }
exit $fail
