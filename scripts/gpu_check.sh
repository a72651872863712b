#!/usr/bin/env bash
# Rule 3's device figures: block tables to the GPU (one pinned buffer, one asynchronous copy per step).
#
# For a person with an NVIDIA GPU; headless, a few minutes after the first install. It
#   1. makes the venv with the torch extra (`make setup EXTRAS=test,torch`; PyPI's Linux x86_64 torch wheels
#      are CUDA builds), unless PYTHON names an interpreter that already has a CUDA torch;
#   2. stops with exit status 2 if torch sees no CUDA device (nothing here would be a device figure);
#   3. runs tests/test_table_copy.py, which on CUDA checks that every variant's device tables equal the host's;
#   4. measures the `paper` scenario and the concurrency sweep on the GPU and writes
#      results/<id>-table-copy/results.csv (tidy rows, metric table_copy_*, source cuda-events / perf_counter_ns)
#      with raw per-step samples under raw/, then prints a small table.
#
# Usage: scripts/gpu_check.sh [options of `kvblock-bench table-copy`, e.g. --steps 100 --out DIR]
# Environment: PYTHON=/path/to/python (skip the venv), VENV=.venv, LIMIT_S=900 (wall-clock limit of step 4).
set -euo pipefail
cd "$(dirname "$0")/.."
export MPLBACKEND=Agg PYTHONUNBUFFERED=1

if [[ -n "${PYTHON:-}" ]]; then
    PY=$PYTHON
else
    VENV=${VENV:-.venv}
    make --no-print-directory setup EXTRAS=test,torch VENV="$VENV"
    PY=$VENV/bin/python
fi

"$PY" - <<'EOF' || exit 2
import sys

import torch

if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (a CPU-only build, or no driver): nothing to measure")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
EOF

"$PY" -m pytest -q -p no:cacheprovider tests/test_table_copy.py

limit=()
if command -v timeout >/dev/null; then
    limit=(timeout "${LIMIT_S:-900}")
fi
"${limit[@]}" "$PY" -m harness.cli table-copy --device cuda "$@"
