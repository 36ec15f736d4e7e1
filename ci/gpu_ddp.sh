#!/usr/bin/env bash
# The multi-GPU runner of chapter 9: data-parallel (DDP) step benchmarks at 1, 2, 4, 8 GPUs.
#   OUT=/path bash ci/gpu_ddp.sh                       # both presets, fp32 and bf16, eager
#   MODES="eager compile-ro" OUT=/path bash ci/gpu_ddp.sh
# For n = 1, 2, 4, 8 up to the GPU count it runs one torchrun per n:
#   torchrun --standalone --nproc_per_node n -m ftlib.harness.ddp_bench --preset gpt2 fasttransformer ...
# Rows go to data/results/<gpu slug>/ddp.jsonl (rank 0 writes); keys already stored are skipped,
# so a second call continues where the first stopped. The file is copied to $OUT at the end.
# Provenance: a copied tree has no .git; pass FTLIB_COMMIT=<commit> (or put it in .ftlib-commit).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-build/ddp}"
mkdir -p "$out"
log="$out/ddp.log"
: > "$log"

# NVLink multicast (NVLS) is not allowed on the GPU hosts the book measures on: keep it off in NCCL, PyTorch's
# symmetric memory and NVSHMEM (ftlib.harness.distributed.setup sets the same defaults).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # torchrun's default; stated so it is not a warning
if [ -z "${FTLIB_COMMIT:-}" ] && [ -f .ftlib-commit ]; then FTLIB_COMMIT="$(cat .ftlib-commit)"; fi
if [ -z "${FTLIB_COMMIT:-}" ]; then FTLIB_COMMIT="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"; fi
export FTLIB_COMMIT

B="${B:-32}" T="${T:-256}" STEPS="${STEPS:-50}" WARMUP="${WARMUP:-10}" MODES="${MODES:-eager}"
PER_RUN_S="${PER_RUN_S:-540}"
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
slug=$(python3 -c 'import torch; from ftlib.env import device_slug; print(device_slug("cuda") if torch.cuda.is_available() else "cpu")')
{ command -v nvidia-smi > /dev/null && nvidia-smi topo -m 2>&1 || true
  echo "gpus $ngpu slug $slug commit $FTLIB_COMMIT B=$B T=$T steps=$STEPS modes=$MODES"; } | tee -a "$log"
[ "$ngpu" -ge 1 ] || { echo "gpu_ddp: no CUDA device" | tee -a "$log"; exit 2; }

rc=0
for n in 1 2 4 8; do
  [ "$n" -le "$ngpu" ] || break
  echo "== n=$n" | tee -a "$log"
  # shellcheck disable=SC2086  # MODES is a word list on purpose
  timeout -k 15 "$PER_RUN_S" torchrun --standalone --nproc_per_node "$n" -m ftlib.harness.ddp_bench \
    --preset gpt2 fasttransformer --precision fp32 bf16 --mode $MODES \
    --B "$B" --T "$T" --steps "$STEPS" --warmup "$WARMUP" \
    --out "data/results/$slug/ddp.jsonl" 2>&1 | tee -a "$log"
  r=${PIPESTATUS[0]}
  [ "$r" = 0 ] || { echo "gpu_ddp: n=$n exited with $r" | tee -a "$log"; rc=$r; }
done
cp "data/results/$slug/ddp.jsonl" "$out/ddp.jsonl" 2>/dev/null || echo "gpu_ddp: no rows written" | tee -a "$log"
exit "$rc"
