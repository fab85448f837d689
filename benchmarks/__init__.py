"""Speed benchmarks of define-fairseq (CPU). Run ``make bench`` or ``python -m benchmarks.<name>``."""
