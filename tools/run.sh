#!/usr/bin/env bash
# The main job: trains the CNN (with BatchNorm) on Fashion-MNIST in DP mode and in DDP mode on the available
# devices (every GPU, else two CPU devices), then benchmarks single-device, DP and DDP on the same batch, and
# prints the comparison; then a language model: tokenizes the fortunes corpus, pretrains the tiny Llama in DP
# and in DDP, and prints both validation curves and the memory per device. Outputs (JSON, CSV, PNG) go to out/.
#
#   tools/run.sh                 # 2 epochs per mode (about 5 minutes on a 2-core machine)
#   DPE_EPOCHS=10 tools/run.sh   # the full run of docs/BENCHMARKS.md
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //tools/dpe:dpe
dpe=bazel-bin/tools/dpe/dpe
epochs="${DPE_EPOCHS:-2}"
mkdir -p out
"$dpe" devices
for mode in dp ddp; do
  echo
  echo "== dpe train --model cnn --mode $mode --epochs $epochs =="
  "$dpe" train --model cnn --mode "$mode" --epochs "$epochs" --batch-size 128 --lr 0.05 --json "out/train_$mode.json"
done
echo
echo "== dpe bench --model cnn (single device, DP, DDP; same model, data and global batch 128) =="
"$dpe" bench --model cnn --batch-size 128 --steps 20 --warmup 3 --json out/bench_cnn.json --csv out/bench_cnn.csv \
  --png out/bench_cnn.png
python3 - <<'PY'
import json
print("\n== DP vs DDP: CNN on Fashion-MNIST ==")
print(f"{'mode':6} {'devices':16} {'epochs':>6} {'test accuracy':>14} {'train samples/s':>16}")
for mode in ("dp", "ddp"):
    r = json.load(open(f"out/train_{mode}.json"))
    rate = sum(e["samples_per_s"] for e in r["epochs"]) / len(r["epochs"])
    print(f"{mode:6} {r['devices']:16} {len(r['epochs']):>6} {r['final_test_accuracy']:>14.4f} {rate:>16.0f}")
PY
echo
echo "== dpe tokenize: the fortunes corpus (Debian's fortunes package), vocabulary 8192 =="
mapfile -t fortunes < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
"$dpe" tokenize --input "${fortunes[@]}" --vocab-size 8192 --out out/fortunes --force
for mode in dp ddp; do
  echo
  echo "== dpe train --model llama --llama-preset tiny --mode $mode =="
  "$dpe" train --model llama --llama-preset tiny --data out/fortunes --mode "$mode" --batch-size 16 --seq-len 64 \
    --max-steps "${DPE_LLM_STEPS:-200}" --eval-every 50 --lr 1e-3 --json "out/llama_$mode.json"
done
python3 - <<'PY'
import json
print("\n== DP vs DDP: the tiny Llama on fortunes (validation loss by step; peak MB per device) ==")
for mode in ("dp", "ddp"):
    r = json.load(open(f"out/llama_{mode}.json"))
    curve = "  ".join(f"{s['step']}: {s['val_loss']}" for s in r["steps"] if "val_loss" in s)
    memory = "  ".join(f"{d} {mb}" for d, mb in r["peak_memory_mb"].items())
    rate = r["steps"][-1]["tokens_per_s"]
    print(f"{mode:4} {curve}  |  {rate} tokens/s  |  {memory}")
PY
echo "(tables, JSON, CSV and the chart: out/)"
