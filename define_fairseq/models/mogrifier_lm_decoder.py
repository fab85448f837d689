"""The decoder of ``mogrifier_lstm_lm`` (:class:`MogrifierLMDecoder`: embedding, Mogrifier LSTM stack, tied output
layer), configured before it is built: :func:`resolve_mogrifier_lm` reads, parses and checks every flag of the
model's configuration into a :class:`MogrifierLMSpec`, and :func:`build_mogrifier_decoder` builds the decoder from the
spec alone. The model, its options and its archs are in :mod:`define_fairseq.models.mogrifier_lstm_lm`, whose
docstring describes them."""

import math
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
from fairseq import utils
from torch import Tensor

from define_fairseq.models.input_layer import InputLayerSpec, build_input_layer, resolve_input_layer
from define_fairseq.models.recurrent_decoder import RecurrentDecoder
from define_fairseq.modules.checks import check_nonnegative, check_positive, check_probability
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


@dataclass(frozen=True)
class MogrifierLMSpec:
    """A :class:`MogrifierLMDecoder`'s configuration, read and checked: what :func:`build_mogrifier_decoder` builds.

    ``input``: the input layer (of width e, the first layer's input; the output layer ties to its table). The
    stack's arguments as :class:`~define_fairseq.modules.mogrifier.lstm.MogrifierLSTM` names them (``hidden_size``
    to ``state_dropout_per_step``), and how it runs: ``cuda_graphs`` and the layers' ``kernels``. The output
    layer's: ``mos_components`` softmaxes, ``projection_dropout``. The decoder's: ``softmax_temperature``,
    ``drop_state_probability``, ``l2_penalty``.
    """

    input: InputLayerSpec
    hidden_size: int
    num_layers: int
    rounds: int
    rank: int
    cap_input_gate: bool
    forget_bias: float
    input_dropout: float
    inter_layer_dropout: float
    state_dropout: float
    output_dropout: float
    sum_layer_outputs: bool
    shared_mask_dropout: bool
    state_dropout_per_step: bool
    cuda_graphs: bool
    kernels: str
    mos_components: int
    projection_dropout: float
    softmax_temperature: float
    drop_state_probability: float
    l2_penalty: float


DROPOUTS = ("input_dropout", "inter_layer_dropout", "state_dropout", "output_dropout")  # the stack's


def flag(name: str) -> str:
    """The flag of the stack's argument ``name``: ``--mogrifier-`` and the name, dashed."""
    return f"--mogrifier-{name.replace('_', '-')}"


def resolve_mogrifier_lm(cfg, dictionary) -> MogrifierLMSpec:
    """The decoder that ``cfg`` (a namespace of :class:`~define_fairseq.models.mogrifier_lstm_lm.MogrifierLSTMLMConfig`
    fields) describes over ``dictionary``, every flag checked and nothing built: a V x e table, or a V x n table and
    a projective map or DeFINE unit n -> e, under the stack and an output layer tied to the table. Raises
    ``ValueError`` naming the flag for every impossible value or combination."""
    num_layers = check_positive(cfg.mogrifier_layers, "--mogrifier-layers")
    hidden = check_positive(cfg.mogrifier_hidden_size, "--mogrifier-hidden-size")
    embed_dim = hidden if cfg.mogrifier_embed_dim is None else cfg.mogrifier_embed_dim  # e: default the state's
    layer = resolve_input_layer(cfg, dictionary, embed_dim, "--mogrifier-embed-dim", table_init=lamb_table_init)
    rounds = check_nonnegative(cfg.mogrifier_rounds, "--mogrifier-rounds", "0: a plain LSTM")
    smallest = min(embed_dim, hidden)
    if cfg.mogrifier_rank < 0 or (rounds > 0 and cfg.mogrifier_rank >= smallest):
        raise ValueError(
            f"--mogrifier-rank={cfg.mogrifier_rank}: give 0 (full rank) or a rank below "
            f"min(--mogrifier-embed-dim, --mogrifier-hidden-size) = {smallest}"
        )
    temperature = cfg.mogrifier_softmax_temperature
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"--mogrifier-softmax-temperature={temperature} must be a positive number (1: no temperature)")
    mask = str(cfg.mogrifier_state_dropout_mask)
    if mask not in STATE_MASKS:
        raise ValueError(
            f"--mogrifier-state-dropout-mask={mask}: give window (one mask per BPTT window) or step (a new mask at "
            f"every step)"
        )
    if str(cfg.mogrifier_kernels) not in KERNELS:
        raise ValueError(f"--mogrifier-kernels={cfg.mogrifier_kernels}: give one of {', '.join(KERNELS)}")
    dropouts = {name: check_probability(getattr(cfg, f"mogrifier_{name}"), flag(name)) for name in DROPOUTS}
    # lamb's downprojected_output_dropout: the output dropout unless given
    projection_dropout, projection_flag = cfg.mogrifier_projection_dropout, "--mogrifier-projection-dropout"
    if projection_dropout is None:
        projection_dropout, projection_flag = dropouts["output_dropout"], flag("output_dropout")
    return MogrifierLMSpec(
        input=layer,
        hidden_size=hidden,
        num_layers=num_layers,
        rounds=rounds,
        rank=cfg.mogrifier_rank,
        cap_input_gate=not cfg.mogrifier_no_cap_input_gate,
        forget_bias=cfg.mogrifier_forget_bias,
        **dropouts,
        sum_layer_outputs=cfg.mogrifier_sum_layer_outputs,
        shared_mask_dropout=cfg.mogrifier_shared_mask_dropout,
        state_dropout_per_step=mask == "step",
        cuda_graphs=not cfg.mogrifier_no_cuda_graphs,
        kernels=str(cfg.mogrifier_kernels),
        mos_components=check_positive(cfg.mogrifier_mos_components, "--mogrifier-mos-components", "1: one softmax"),
        projection_dropout=check_probability(projection_dropout, projection_flag),
        softmax_temperature=temperature,
        drop_state_probability=check_probability(
            cfg.mogrifier_drop_state_probability, "--mogrifier-drop-state-probability"
        ),
        l2_penalty=check_nonnegative(cfg.mogrifier_l2_penalty, "--mogrifier-l2-penalty"),
    )


def build_mogrifier_decoder(spec: MogrifierLMSpec, dictionary) -> MogrifierLMDecoder:
    """The decoder ``spec`` describes (of :func:`resolve_mogrifier_lm`, which checked it), over ``dictionary``.

    Shapes: as :class:`MogrifierLMDecoder`'s.
    """
    layer = build_input_layer(spec.input)
    lstm = MogrifierLSTM(
        spec.input.width,
        spec.hidden_size,
        num_layers=spec.num_layers,
        rounds=spec.rounds,
        rank=spec.rank,
        cap_input_gate=spec.cap_input_gate,
        forget_bias=spec.forget_bias,
        **{name: getattr(spec, name) for name in DROPOUTS},
        sum_layer_outputs=spec.sum_layer_outputs,
        shared_mask_dropout=spec.shared_mask_dropout,
        state_dropout_per_step=spec.state_dropout_per_step,
    )
    lstm.cuda_graphs = spec.cuda_graphs  # on a GPU only (MogrifierLSTM.cuda_graphs)
    for lstm_layer in lstm.layers:
        lstm_layer.kernels = spec.kernels
    output = TiedOutput(
        layer.weight,
        spec.hidden_size,
        components=spec.mos_components,
        dropout=spec.projection_dropout,
        shared_mask=spec.shared_mask_dropout,
    )
    return MogrifierLMDecoder(
        dictionary,
        layer.embed,
        lstm,
        output,
        softmax_temperature=spec.softmax_temperature,
        drop_state_probability=spec.drop_state_probability,
        l2_penalty=spec.l2_penalty,
    )
