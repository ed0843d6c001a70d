"""The deliverable: export bundle bound to its base model, verify, dossier, rental plan."""
