#!/usr/bin/env bash
# GPU check: one NVIDIA GPU, bf16, a Qwen2.5-1.5B-shaped random policy, a 2-iteration fit with the
# hf rollout backend, plainly and under configs/trainer/fsdp.yaml; prints one table (see gpu_check.py).
#   bash benchmarks/gpu_check.sh [OUT_DIR]
# Needs torch with CUDA, lightning, transformers, tensorboard, torchmetrics; gymnasium,
# jsonargparse and bm25s are installed from .whl/ when that folder holds their wheels (a machine
# without a package index), else from the index when missing. vLLM is not checked here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
missing=$($PY - <<'PY'
import importlib.util
print(" ".join(m for m in ("gymnasium", "jsonargparse", "bm25s", "docstring_parser", "typeshed_client") if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    $PY -m pip install -q "gymnasium>=1.0" "jsonargparse[signatures]>=4.32" "bm25s>=0.2"
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec $PY benchmarks/gpu_check.py "${1:-${OUT:-/tmp}/gpu_check}"
