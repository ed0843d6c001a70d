"""tuneproof: make a fine-tuning experiment provably sound.

The package layout follows the protocol (../shared/PROTOCOL.md):

- ``study``        the study file (hypothesis, guards, data, model, method, training, eval)
- ``registry``     run ids, statuses and the SQLite index of every run
- ``data/``        loading, splits, fingerprints, duplicates, audits, token inspection
- ``models/``      base model resolution and identity, LoRA / full fine-tuning setup
- ``training/``    the training step (Trainer + PEFT) and loss normalisation
- ``evaluation/``  generation, metrics, paired comparison, guards, sealed test split
- ``preflight/``   environment, backend, update check, memory, accumulation, smoke pass
- ``deliver/``     export bundle, verify, dossier, rental plan
- ``recipes/``     one module per end-to-end command; ``cli`` wires them to Typer
"""

import logging as _logging

__version__ = "0.1.0"
SCHEMA_VERSION = 1

# bitsandbytes (imported by PEFT whenever it is installed) warns on every import, on CPUs with
# AVX512-BF16, that it could not fetch an optional kernel from the Hugging Face hub through the
# ``kernels`` package. tuneproof never downloads at run time and its own 4-bit probe
# (models/quant.py) decides whether QLoRA runs, so the line only adds noise to every command.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
