#!/usr/bin/env bash
# supervise.py restarts a failed dpe train job from its newest checkpoint: a job whose device fails twice (once
# in each of its first two attempts) finishes after two restarts, and its final checkpoint equals the
# uninterrupted run's, byte for byte; with --max-restarts 1 it gives up with the job's status; a command that
# writes no checkpoint is refused.
set -uo pipefail
bin="$1"
supervise="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
# 4 steps per epoch (256 samples, batch 64), a checkpoint after each of 3 epochs.
job=("$bin" train --model mlp --mode ddp --cpu-devices 2 --limit 256 --batch-size 64 --epochs 3 --seed 5 --save-every 1)

"${job[@]}" --checkpoint "$tmp/whole.safetensors" >/dev/null 2>&1 || { echo "FAILED: the uninterrupted run"; fail=1; }

# cpu:1 fails in each attempt's step 5 (steps count from 0 in every run): the first attempt saves epoch 1 and
# fails in epoch 2; the second resumes after epoch 1, saves epoch 2 and fails in epoch 3; the third finishes.
out=$(python3 "$supervise" --max-restarts 3 -- "${job[@]}" --checkpoint "$tmp/supervised.safetensors" \
      --inject-failure cpu:1@5 2>&1)
status=$?
if [[ $status -ne 0 ]] || [[ $(grep -c "^supervise: restart" <<<"$out") -ne 2 ]]; then
  echo "FAILED: supervised job: status $status, want 0 after 2 restarts:"; echo "$out" | grep "supervise\|dpe train:" ; fail=1
fi
grep -qF "supervise: 3 attempt(s), 2 restart(s)" <<<"$out" || { echo "FAILED: no summary line: $out"; fail=1; }
cmp "$tmp/whole.safetensors" "$tmp/supervised.safetensors" || { echo "FAILED: supervised != uninterrupted"; fail=1; }

out=$(python3 "$supervise" --max-restarts 1 -- "${job[@]}" --checkpoint "$tmp/gives_up.safetensors" \
      --inject-failure cpu:1@5 2>&1)
status=$?
[[ $status -eq 2 ]] && grep -qF "giving up (--max-restarts 1)" <<<"$out" ||
  { echo "FAILED: --max-restarts 1: status $status, want 2 and 'giving up':"; echo "$out" | tail -3; fail=1; }

out=$(python3 "$supervise" -- "$bin" train --model mlp 2>&1)
[[ $? -ne 0 ]] && grep -qF "the command must write checkpoints" <<<"$out" ||
  { echo "FAILED: a job without checkpoints was not refused: $out"; fail=1; }
exit $fail
