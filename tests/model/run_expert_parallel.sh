#!/bin/bash
# `mpirun -np 2 dsk run` (expert parallelism, issue 8) prints the same token ids as `dsk run` on
# one rank, for a random v32-tiny checkpoint and five prompts of mixed lengths.
# Usage: run_expert_parallel.sh DSK_PROGRAM MPIEXEC
set -euo pipefail
dsk=$1
mpiexec=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$dsk" make-checkpoint --preset v32-tiny --seed 5 "$dir/ckpt" >/dev/null
printf '1 2 3 4 5\n10 20 30\n7\n99 98 97 96 95 94 93 92 91 90 89 88 87 86\n42 43\n' >"$dir/prompts"
run=(run --checkpoint "$dir/ckpt" --prompt-ids "$dir/prompts" --max-new-tokens 6)
DSK_DETERMINISTIC=1 "$dsk" "${run[@]}" >"$dir/one"
"$mpiexec" -np 2 --oversubscribe "$dsk" "${run[@]}" >"$dir/two"
if ! diff "$dir/one" "$dir/two"; then
  echo "FAILED: mpirun -np 2 dsk run differs from dsk run"
  exit 1
fi
lines=$(wc -l <"$dir/one")
if [ "$lines" != 5 ]; then
  echo "FAILED: $lines output lines, expected 5"
  exit 1
fi
echo "PASSED: 2 ranks print the single-rank tokens"
