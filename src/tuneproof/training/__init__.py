"""What is trained and how one optimizer step is built (docs/PROTOCOL.md steps 4-5)."""
