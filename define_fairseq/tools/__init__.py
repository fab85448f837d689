"""Command-line helpers: ``python -m define_fairseq.tools.<name> --help``."""
