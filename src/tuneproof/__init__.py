"""tuneproof: make a fine-tuning experiment provably sound.

The protocol it executes is docs/PROTOCOL.md; the packages, their layers and what each may import
are mapped in docs/ARCHITECTURE.md (enforced by tests/architecture/test_layers.py).
"""

import logging as _logging

__version__ = "0.1.0"

# bitsandbytes (imported by PEFT whenever it is installed) warns on every import, on CPUs with
# AVX512-BF16, that it could not fetch an optional kernel from the Hugging Face hub through the
# ``kernels`` package. tuneproof never downloads at run time and its own 4-bit probe
# (models/quant.py) decides whether QLoRA runs, so the line only adds noise to every command.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
