"""Evaluation you can trust: generation, metrics, paired comparison, guards, sealed test split."""
