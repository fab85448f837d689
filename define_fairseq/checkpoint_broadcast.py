"""fairseq's checkpoint broadcast under torch >= 2.6: the run's configuration allowed through ``torch.load``.

Resuming a data-parallel run, fairseq loads the checkpoint on rank 0 only and sends it to the other ranks as a
pickle (``fairseq.distributed.utils.broadcast_object``: ``torch.save`` on rank 0, ``torch.load`` on the others),
unless ``--load-checkpoint-on-all-dp-ranks`` makes every rank read the file itself. The object sent holds the
configuration as an omegaconf ``DictConfig``, which ``torch.load``'s default ``weights_only=True`` (torch 2.6 on)
refuses: every rank but 0 stopped with ``UnpicklingError: ... Unsupported global: GLOBAL
omegaconf.dictconfig.DictConfig``. Importing the plugin adds omegaconf's configuration containers and nodes, the
builtins they are built from and fairseq's ``_TensorPlaceholder`` (which stands for each tensor in the pickle: the
tensors travel separately) to torch's allowed globals (:func:`torch.serialization.add_safe_globals`), so the stock
multi-rank command resumes.

Why that is safe: these classes hold data (the placeholder, one integer). Unpickling one sets its fields and calls
nothing else, and the builtins allowed (``dict``, ``list``, ``int``, ...) only build containers and numbers, so a
file can carry no more than a configuration of strings, numbers and nested containers. Its ``${...}`` interpolations
are resolved only by the resolvers the program registered (omegaconf's own read environment variables and other
keys; fairseq registers none). A configuration whose nodes need more (an enum or dataclass type, as configurations
converted from very old argparse checkpoints can) is still refused by ``torch.load``;
``--load-checkpoint-on-all-dp-ranks`` resumes those.
"""

import collections
import typing

import torch
from fairseq.distributed.utils import _TensorPlaceholder
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

BROADCAST_GLOBALS = [
    _TensorPlaceholder,
    DictConfig,
    ListConfig,
    ContainerMetadata,
    Metadata,
    AnyNode,
    StringNode,
    IntegerNode,
    FloatNode,
    BooleanNode,
    typing.Any,
    dict,
    list,
    int,
    float,
    str,
    bool,
    collections.defaultdict,
]


def allow_configurations_in_torch_load() -> None:
    """Add :data:`BROADCAST_GLOBALS` to the globals that ``torch.load(weights_only=True)`` accepts."""
    torch.serialization.add_safe_globals(BROADCAST_GLOBALS)
