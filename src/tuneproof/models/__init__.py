"""Base model resolution and identity; LoRA / full fine-tuning setup (docs/PROTOCOL.md step 4)."""
