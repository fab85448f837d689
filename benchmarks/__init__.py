"""Speed benchmarks of define-fairseq: ``python -m benchmarks.<name>`` (``make bench``); see benchmarks/README.md."""
