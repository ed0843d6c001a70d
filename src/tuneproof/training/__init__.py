"""What is trained and how one optimizer step is built (PROTOCOL.md steps 4-5)."""
