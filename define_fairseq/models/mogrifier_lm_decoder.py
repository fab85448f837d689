"""The decoder of ``mogrifier_lstm_lm`` (:class:`MogrifierLMDecoder`: embedding, Mogrifier LSTM stack, tied output
layer) and the function that builds it from the model's configuration (:func:`build_mogrifier_decoder`); the model,
its options and its archs are in :mod:`define_fairseq.models.mogrifier_lstm_lm`, whose docstring describes them."""

import math
from typing import List, Optional

import torch
import torch.nn as nn
from fairseq import utils
from torch import Tensor

from define_fairseq.models.config_helpers import flag_names
from define_fairseq.models.input_layer import InputLayer, InputLayerSpec, resolve_input_layer
from define_fairseq.models.recurrent_decoder import RecurrentDecoder
from define_fairseq.modules.checks import check_probability
from define_fairseq.modules.mogrifier.layer import KERNELS
from define_fairseq.modules.mogrifier.lstm import MogrifierLSTM
from define_fairseq.modules.tied_output import TiedOutput
from define_fairseq.modules.variance_scaling import variance_scaling_

STATE_MASKS = ["window", "step"]  # --mogrifier-state-dropout-mask


class MogrifierLMDecoder(RecurrentDecoder):
    """Embedding -> :class:`MogrifierLSTM` -> :class:`TiedOutput` (see
    :mod:`define_fairseq.models.mogrifier_lstm_lm`'s docstring).

    Args:
        dictionary: the target dictionary (V symbols).
        embed_tokens: token embedding with ``embedding_dim == lstm.input_size`` and a ``weight`` (the ``V x e``
            table the output is tied to): an ``nn.Embedding`` or a DeFINE embedding.
        lstm: the recurrent stack.
        output_projection: the tied output layer.
        softmax_temperature: eval-mode temperature.
        drop_state_probability: training-mode probability of resetting a stream's carried state.
        l2_penalty: lamb's L2 coefficient (``extra["regularization"]`` in training).

    ``forward(tokens [B, T], src_lengths=None, reset_state=None, incremental_state=None, features_only=False)``
    returns ``(x, extra)``: ``x`` the logits ``[B, T, V]`` (with one softmax), the log-probabilities ``[B, T, V]``
    (with a mixture), or the stack's output ``[B, T, H]`` with ``features_only``. ``extra["regularization"]``
    (training with an L2 penalty only) is the scalar penalty. During incremental decoding only the new tokens'
    positions are returned.
    """

    def __init__(
        self,
        dictionary,
        embed_tokens: nn.Module,
        lstm: MogrifierLSTM,
        output_projection: TiedOutput,
        softmax_temperature: float = 1.0,
        drop_state_probability: float = 0.0,
        l2_penalty: float = 0.0,
    ):
        super().__init__(dictionary, embed_tokens, lstm, "Mogrifier LSTM state", "--mogrifier-embed-dim")
        check_probability(drop_state_probability, "drop_state_probability")
        self.output_projection = output_projection
        self.softmax_temperature = softmax_temperature
        self.drop_state_probability = drop_state_probability
        self.l2_penalty = l2_penalty

    def starting_state(self, state: Optional[List]) -> Optional[List]:
        """In training, zero each stream's carried ``(h, c)`` with probability ``drop_state_probability``."""
        if state is None or not self.training or self.drop_state_probability <= 0:
            return state
        batch_size = state[0][0].size(0)
        keep = torch.rand(batch_size, 1) >= self.drop_state_probability  # CPU generator: seeded by fairseq
        keep = keep.to(device=state[0][0].device, dtype=state[0][0].dtype)
        return [(h * keep, c * keep) for h, c in state]

    def recur(self, tokens, state):
        x, final_state = self.lstm(self.embed_tokens(tokens), state)
        extra = {"attn": None}
        if self.training and self.l2_penalty > 0:
            extra["regularization"] = self.l2_regularization()
        return x, final_state, extra

    def l2_regularization(self) -> Tensor:
        """lamb's ``l2_penalty / 2 * sum(theta^2)`` over every (trainable) parameter, each shared one once."""
        squares = [p.float().pow(2).sum() for p in self.parameters() if p.requires_grad]
        return 0.5 * self.l2_penalty * torch.stack(squares).sum()

    def output_layer(self, features, **kwargs):
        # A mixture has no single logits to divide by T: its components are divided here (in eval mode only).
        temperature = 1.0 if self.training else self.softmax_temperature
        return self.output_projection(features, temperature if self.output_projection.components > 1 else 1.0)

    def get_normalized_probs_scriptable(self, net_output, log_probs: bool, sample=None):
        """``softmax(logits / T)`` in eval mode, ``softmax(logits)`` in training (a mixture's output already is
        log-probabilities, with its temperature applied)."""
        scores = net_output[0]
        if self.output_projection.components == 1 and not self.training and self.softmax_temperature != 1.0:
            scores = scores / self.softmax_temperature
        if log_probs:
            return utils.log_softmax(scores, dim=-1)
        return utils.softmax(scores, dim=-1)


def lamb_table_init(weight: Tensor) -> None:
    """lamb's initialisation of the table: variance scaling with fan_out = e."""
    variance_scaling_(weight, weight.size(1))


def embed_width(cfg) -> int:
    """e, the width of the embeddings fed to the first layer: ``--mogrifier-embed-dim``, else the hidden size."""
    return cfg.mogrifier_hidden_size if cfg.mogrifier_embed_dim is None else cfg.mogrifier_embed_dim


def mogrifier_input_spec(cfg, dictionary) -> InputLayerSpec:
    """The input layer ``cfg`` describes: a V x e table, or a V x n table and a projective map or DeFINE unit n -> e;
    the output layer ties to the table. The model's flags are checked first (``ValueError`` naming them)."""
    check_mogrifier_config(cfg)
    return resolve_input_layer(cfg, dictionary, embed_width(cfg), "--mogrifier-embed-dim", table_init=lamb_table_init)


def check_mogrifier_config(cfg) -> None:
    """The checks of the Mogrifier flags that no module makes (``ValueError`` naming the flag)."""
    hidden, embed_dim = cfg.mogrifier_hidden_size, embed_width(cfg)
    for flag, value in (
        ("--mogrifier-layers", cfg.mogrifier_layers),
        ("--mogrifier-hidden-size", hidden),
        ("--mogrifier-embed-dim", embed_dim),
    ):
        if value < 1:
            raise ValueError(f"{flag}={value} must be at least 1")
    if cfg.mogrifier_rounds < 0:
        raise ValueError(f"--mogrifier-rounds={cfg.mogrifier_rounds} must be >= 0 (0: a plain LSTM)")
    smallest = min(embed_dim, hidden)
    if cfg.mogrifier_rank < 0 or (cfg.mogrifier_rounds > 0 and cfg.mogrifier_rank >= smallest):
        raise ValueError(
            f"--mogrifier-rank={cfg.mogrifier_rank}: give 0 (full rank) or a rank below "
            f"min(--mogrifier-embed-dim, --mogrifier-hidden-size) = {smallest}"
        )
    temperature = cfg.mogrifier_softmax_temperature
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"--mogrifier-softmax-temperature={temperature} must be a positive number (1: no temperature)")
    if str(cfg.mogrifier_state_dropout_mask) not in STATE_MASKS:
        raise ValueError(
            f"--mogrifier-state-dropout-mask={cfg.mogrifier_state_dropout_mask}: give window (one mask "
            f"per BPTT window) or step (a new mask at every step)"
        )
    if cfg.mogrifier_mos_components < 1:
        raise ValueError(
            f"--mogrifier-mos-components={cfg.mogrifier_mos_components} must be at least 1 (1: one softmax)"
        )
    if str(cfg.mogrifier_kernels) not in KERNELS:
        raise ValueError(f"--mogrifier-kernels={cfg.mogrifier_kernels}: give one of {', '.join(KERNELS)}")
    if not (cfg.mogrifier_l2_penalty >= 0 and math.isfinite(cfg.mogrifier_l2_penalty)):
        raise ValueError(f"--mogrifier-l2-penalty={cfg.mogrifier_l2_penalty} must be >= 0")


def build_mogrifier_decoder(cfg, dictionary, layer: InputLayer) -> MogrifierLMDecoder:
    """The decoder described by ``cfg`` (a namespace of
    :class:`~define_fairseq.models.mogrifier_lstm_lm.MogrifierLSTMLMConfig` fields) over the input layer ``layer``
    (of :func:`mogrifier_input_spec`, which checks the flags); the modules check their own arguments.
    """
    hidden, embed_dim = cfg.mogrifier_hidden_size, embed_width(cfg)
    projection_dropout = cfg.mogrifier_projection_dropout
    if projection_dropout is None:
        projection_dropout = cfg.mogrifier_output_dropout
    dropouts = ("input_dropout", "inter_layer_dropout", "state_dropout", "output_dropout")
    with flag_names(**{name: f"--mogrifier-{name.replace('_', '-')}" for name in dropouts}):
        lstm = MogrifierLSTM(
            embed_dim,
            hidden,
            num_layers=cfg.mogrifier_layers,
            rounds=cfg.mogrifier_rounds,
            rank=cfg.mogrifier_rank,
            cap_input_gate=not cfg.mogrifier_no_cap_input_gate,
            forget_bias=cfg.mogrifier_forget_bias,
            **{name: getattr(cfg, f"mogrifier_{name}") for name in dropouts},
            sum_layer_outputs=cfg.mogrifier_sum_layer_outputs,
            shared_mask_dropout=cfg.mogrifier_shared_mask_dropout,
            state_dropout_per_step=str(cfg.mogrifier_state_dropout_mask) == "step",
        )
    lstm.cuda_graphs = not cfg.mogrifier_no_cuda_graphs  # on a GPU only (MogrifierLSTM.cuda_graphs)
    for lstm_layer in lstm.layers:
        lstm_layer.kernels = str(cfg.mogrifier_kernels)
    with flag_names(
        dropout="--mogrifier-output-dropout"
        if cfg.mogrifier_projection_dropout is None
        else "--mogrifier-projection-dropout"
    ):
        output = TiedOutput(
            layer.weight,
            hidden,
            components=cfg.mogrifier_mos_components,
            dropout=projection_dropout,
            shared_mask=cfg.mogrifier_shared_mask_dropout,
        )
    with flag_names(drop_state_probability="--mogrifier-drop-state-probability"):
        return MogrifierLMDecoder(
            dictionary,
            layer.embed,
            lstm,
            output,
            softmax_temperature=cfg.mogrifier_softmax_temperature,
            drop_state_probability=cfg.mogrifier_drop_state_probability,
            l2_penalty=cfg.mogrifier_l2_penalty,
        )
