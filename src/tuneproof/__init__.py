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

__version__ = "0.1.0"
SCHEMA_VERSION = 1
