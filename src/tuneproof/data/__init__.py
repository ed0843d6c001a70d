"""Data protocol (docs/PROTOCOL.md step 3): loading, cleaning, splits, fingerprints, duplicates, audits, inspection."""
