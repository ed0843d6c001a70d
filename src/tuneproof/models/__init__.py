"""Base model resolution and identity; LoRA / full fine-tuning setup (PROTOCOL.md step 4)."""
