"""The plugin's user commands: ``python -m define_fairseq.tools.<name> --help``. The repository's own machinery (the
examples' comparison runner, corpus builders and results tables) is in its ``scripts/`` and is not installed."""
