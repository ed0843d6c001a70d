"""Preflight (docs/PROTOCOL.md steps 4-6): checks that fail before the rental hours are spent."""
