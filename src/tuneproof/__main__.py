"""``python -m tuneproof``: the same command line as ``tuneproof``."""

from tuneproof.cli import main

main()
