"""fairseq glue: model registrations (fairseq imports this package for ``--user-dir``)."""

from . import transformer_define  # noqa: F401
