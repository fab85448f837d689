"""Fold the DeFINE units of a checkpoint into plain ``V x m`` lookup tables for inference.

DeFINE depends only on the token (the paper's Sec. 3.4), so after training every token's DeFINE output can
be computed once. The folded checkpoint gives the same outputs in eval mode and loads in fairseq-generate,
fairseq-interactive and fairseq-eval-lm with the same command as the original::

    python -m define_fairseq.tools.fold_define checkpoints/checkpoint_best.pt checkpoints/folded.pt
"""

import argparse
import os
import re
from typing import Dict

import torch
import torch.nn as nn

from define_fairseq.modules import DeFINEEmbedding
from define_fairseq.tools.average_checkpoints import CheckpointError, exit_on_checkpoint_error, load_checkpoint


def fold_model(model: nn.Module) -> nn.Module:
    """Replace, in place, every :class:`DeFINEEmbedding` inside ``model`` by its folded form; returns ``model``.

    A module shared by several parents (``--share-all-embeddings``) is folded once and stays shared.
    """
    folded: Dict[int, nn.Module] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, DeFINEEmbedding):
                if id(child) not in folded:
                    folded[id(child)] = child.fold()
                setattr(parent, name, folded[id(child)])
    return model


def _define_prefixes(model_state: Dict[str, torch.Tensor]):
    """Prefixes (``encoder.embed_tokens.``) of the DeFINE embeddings found in a state dict."""
    return sorted(
        {m.group(1) for key in model_state for m in [re.match(r"(.*\.)define\.layers\.0\.weight$", key)] if m}
    )


def fold_state(model_state: Dict[str, torch.Tensor], model_cfg) -> Dict[str, torch.Tensor]:
    """The state dict of the folded model: each DeFINE unit's weights replaced by its ``folded`` table (the map,
    a ``V x n`` table or an adaptive input, is kept)."""
    from define_fairseq.models.input_layer import adaptive_input_cutoff, build_define_embedding

    state = dict(model_state)
    for prefix in _define_prefixes(model_state):
        own = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
        bands = [value for key, value in own.items() if re.match(r"adaptive\.tables\.\d+\.weight$", key)]
        vocab = own["table.weight"].shape[0] if "table.weight" in own else sum(band.shape[0] for band in bands)
        last = max(int(m.group(1)) for key in own for m in [re.match(r"define\.layers\.(\d+)\.weight$", key)] if m)
        layer_weight = own[f"define.layers.{last}.weight"]
        m = layer_weight.shape[0] * layer_weight.shape[2]
        cutoff = adaptive_input_cutoff(model_cfg, vocab) if bands else None
        factor = getattr(model_cfg, "adaptive_input_factor", 4)
        embedding = build_define_embedding(
            model_cfg, vocab, None, m, "--decoder-embed-dim", adaptive_cutoff=cutoff, adaptive_factor=factor
        )
        embedding.load_state_dict(own)
        for key in own:
            if key.startswith("define."):
                del state[prefix + key]
        state[prefix + "folded"] = embedding.folded_table().to(layer_weight.dtype)
    return state


def fold_checkpoint(src: str, dst: str) -> None:
    """Write to ``dst`` the folded form of the fairseq checkpoint ``src``; CheckpointError naming ``src`` when it
    is not a checkpoint with DeFINE units to fold."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf, open_dict

    def read(path):
        # Checkpoints of fairseq's argparse-era models hold an argparse.Namespace, which torch.load's
        # weights_only mode refuses unless it is allowed explicitly.
        with torch.serialization.safe_globals([argparse.Namespace]):
            return checkpoint_utils.load_checkpoint_to_cpu(path)

    state = load_checkpoint(src, read)
    model_cfg = state["cfg"]["model"] if state.get("cfg") is not None else None
    if model_cfg is None or getattr(model_cfg, "define_folded", None) is None:
        arch = getattr(model_cfg, "_name", None) or getattr(model_cfg, "arch", "unknown")
        raise CheckpointError(
            f"{src} is a checkpoint of arch {arch!r}, which has no DeFINE embeddings to fold; "
            f"fold a checkpoint of a define_fairseq model with DeFINE (e.g. transformer_define)"
        )
    if model_cfg.define_folded:
        raise CheckpointError(f"{src} is already folded")
    prefixes = _define_prefixes(state["model"])
    if not prefixes:
        raise CheckpointError(f"{src} has no DeFINE unit weights (no '*.define.layers.0.weight' in its model state)")
    state["model"] = fold_state(state["model"], model_cfg)
    with open_dict(model_cfg):
        model_cfg.define_folded = True
    # fairseq stores its config as plain containers, which torch.load(weights_only=True) accepts.
    state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)
    state["last_optimizer_state"] = None  # the optimizer state belongs to the unfolded parameters
    tmp = dst + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, dst)
    print(f"folded {len(prefixes)} DeFINE embedding(s) ({', '.join(p.rstrip('.') for p in prefixes)}) into {dst}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint of a model with DeFINE embeddings")
    parser.add_argument("output", help="where to write the folded checkpoint")
    args = parser.parse_args(argv)
    with exit_on_checkpoint_error():
        fold_checkpoint(args.checkpoint, args.output)


if __name__ == "__main__":
    main()
