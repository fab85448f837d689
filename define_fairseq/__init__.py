"""define-fairseq: DeFINE, Mogrifier LSTM, gated convolutional LMs and Char2Subword for fairseq.

Use with the stock fairseq programs: ``fairseq-train --user-dir define_fairseq ...``. The modules in
``define_fairseq.modules`` are plain PyTorch and can be used without fairseq.
"""

__version__ = "0.2.0"

try:
    import fairseq  # noqa: F401
except ImportError:  # the plain torch modules stay usable without fairseq
    pass
else:
    from . import criterions, models, tasks  # noqa: F401
    from .checkpoint_broadcast import allow_configurations_in_torch_load

    allow_configurations_in_torch_load()
