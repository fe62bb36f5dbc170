#!/usr/bin/env bash
# One prepared check for a single-GPU machine with torch + transformers (no Ray, no vLLM):
#   1. GRPO steps of the bundled tiny policy on CUDA (torch engine + plain torch learner), timed;
#   2. libra-calibrate profile --device cuda (operators, and the tiny policy's engine overhead),
#      then fit, on this GPU;
#   3. the same steps' measured times next to the cost evaluator's predictions, uncalibrated
#      (datasheet constants) and calibrated.
# Usage: bash scripts/gpu_check.sh [GPU_CATALOG_NAME (default h200)]   -> out/gpu_check/
# Needs ~2-4 minutes on an H200. Not run in CI (no GPU there).
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=${1:-h200}
OUT=${OUT:-out/gpu_check}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
"$PY" -c "import torch, transformers; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
echo "== 1+3a: GRPO steps on CUDA, measured vs uncalibrated prediction"
"$PY" scripts/measure_vs_predict.py --device cuda --gpu "$GPU" --steps 3 --out "$OUT/uncalibrated"
echo "== 2: profile this GPU and fit a calibration"
"$PY" -m cost_models.cli profile --device cuda --out "$OUT/profile" --quick \
  --engine-model libra/runtime/assets/tiny-policy --gpu "$GPU"   # + the torch engine's per-iteration overhead
"$PY" -m cost_models.cli fit --data "$OUT/profile" --gpu "$GPU" -o "$OUT/calibration.json"
echo "== 3b: measured vs calibrated prediction"
"$PY" scripts/measure_vs_predict.py --device cuda --gpu "$GPU" --steps 3 --calibration "$OUT/calibration.json" --out "$OUT/calibrated"
echo "gpu_check: done; results in $OUT"
