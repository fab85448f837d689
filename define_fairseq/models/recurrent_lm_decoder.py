"""The decoder of ``lstm_lm_define`` and ``awd_lstm_lm`` (:class:`RecurrentLMDecoder`), configured before it is
built: :func:`resolve_recurrent_lm` reads, parses and checks every flag of the models' configuration into a
:class:`RecurrentLMSpec`, and :func:`build_recurrent_decoder` builds the decoder from the spec alone."""

from argparse import Namespace
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch.nn as nn
from fairseq.modules import AdaptiveSoftmax
from torch import Tensor

from define_fairseq.models.adaptive_softmax import AdaptiveSoftmaxSpec, build_adaptive_softmax, resolve_adaptive_softmax
from define_fairseq.models.input_layer import (
    InputLayerSpec,
    build_input_layer,
    check_tie,
    resolve_input_layer,
    tie_output,
)
from define_fairseq.models.recurrent_decoder import RecurrentDecoder
from define_fairseq.modules.awd_lstm.locked_dropout import locked_dropout
from define_fairseq.modules.awd_lstm.lstm_stack import LSTMStack
from define_fairseq.modules.awd_lstm.weight_drop import embedding_dropout
from define_fairseq.modules.checks import check_nonnegative, check_positive, check_probability


class RecurrentLMDecoder(RecurrentDecoder):
    """Embedding -> (word and locked dropout) -> :class:`LSTMStack` -> (locked dropout) -> output layer.

    Args:
        dictionary: the target dictionary (V symbols).
        embed_tokens: token embedding with ``embedding_dim`` equal to ``lstm.input_size`` (a table, an adaptive
            input or a DeFINE embedding).
        lstm: the recurrent stack (``hidden_dropout`` and ``weight_drop`` live there).
        output_projection: full softmax ``Linear(d, V)`` (d = n, or the last layer's size when untied); or None.
        adaptive_softmax: fairseq ``AdaptiveSoftmax`` instead of ``output_projection``.
        project_out_dim: bias-free ``Linear(last layer, n)`` before a tied output layer, or None.
        input_dropout, output_dropout: locked dropout on the LSTM input / on the last layer's output.
        embed_dropout: whole-word dropout on the embeddings.
        ar_alpha, tar_beta: AWD-LSTM's activation / temporal activation regularisation.

    ``forward(tokens [B, T], src_lengths=None, reset_state=None, incremental_state=None, features_only=False)``
    returns ``(x, extra)``: ``x`` the logits ``[B, T, V]`` (full softmax), or the features ``[B, T, d]``
    given to the adaptive softmax (and with ``features_only``). ``extra["regularization"]`` (training with
    AR/TAR only) is the scalar penalty, already a mean per token. During incremental decoding only the new
    tokens' positions are returned.
    """

    def __init__(
        self,
        dictionary,
        embed_tokens: nn.Module,
        lstm: LSTMStack,
        output_projection: Optional[nn.Linear] = None,
        adaptive_softmax: Optional[AdaptiveSoftmax] = None,
        project_out_dim: Optional[nn.Linear] = None,
        input_dropout: float = 0.0,
        output_dropout: float = 0.0,
        embed_dropout: float = 0.0,
        ar_alpha: float = 0.0,
        tar_beta: float = 0.0,
    ):
        super().__init__(dictionary, embed_tokens, lstm, "LSTM state", "the DeFINE output width m, --decoder-embed-dim")
        if (output_projection is None) == (adaptive_softmax is None):
            raise ValueError("give exactly one of output_projection (full softmax) and adaptive_softmax")
        for value, name in (
            (input_dropout, "input_dropout"),
            (output_dropout, "output_dropout"),
            (embed_dropout, "embed_dropout"),
        ):
            check_probability(value, name)
        check_nonnegative(ar_alpha, "ar_alpha")
        check_nonnegative(tar_beta, "tar_beta")
        self.project_out_dim = project_out_dim
        self.output_projection = output_projection
        self.adaptive_softmax = adaptive_softmax
        self.input_dropout = input_dropout
        self.output_dropout = output_dropout
        self.embed_dropout = embed_dropout
        self.ar_alpha = ar_alpha
        self.tar_beta = tar_beta
        self.padding_idx = dictionary.pad()

    def recur(self, tokens, state):
        x = self.embed_tokens(tokens)
        x = embedding_dropout(x, tokens, len(self.dictionary), self.embed_dropout, self.training)
        x = locked_dropout(x, self.input_dropout, self.training)
        raw, final_state = self.lstm(x, state)
        x = locked_dropout(raw, self.output_dropout, self.training)
        extra = {"attn": None}
        if self.training and (self.ar_alpha > 0 or self.tar_beta > 0):
            extra["regularization"] = self.activation_regularization(x, raw, tokens.ne(self.padding_idx))
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, final_state, extra

    def activation_regularization(self, dropped: Tensor, raw: Tensor, mask: Tensor) -> Tensor:
        """``alpha * mean(dropped^2) + beta * mean((raw_t - raw_{t-1})^2)`` over the non-padding positions
        (AWD-LSTM's AR and TAR on the last layer). Shapes: ``dropped, raw [B, T, H]``, ``mask [B, T]``."""
        mask = mask.to(raw.dtype).unsqueeze(-1)
        penalty = raw.new_zeros(())
        if self.ar_alpha > 0:
            count = mask.sum().clamp(min=1) * raw.size(-1)
            penalty = penalty + self.ar_alpha * (dropped.pow(2) * mask).sum() / count
        if self.tar_beta > 0 and raw.size(1) > 1:
            pair = mask[:, 1:] * mask[:, :-1]
            count = pair.sum().clamp(min=1) * raw.size(-1)
            penalty = penalty + self.tar_beta * ((raw[:, 1:] - raw[:, :-1]).pow(2) * pair).sum() / count
        return penalty

    def output_layer(self, features, **kwargs):
        if self.adaptive_softmax is not None:
            return features
        return self.output_projection(features)


def awd_table_init(weight: Tensor) -> None:
    """AWD-LSTM's initialisation of the table: U(-0.1, 0.1)."""
    nn.init.uniform_(weight, -0.1, 0.1)


@dataclass(frozen=True)
class RecurrentLMSpec:
    """A :class:`RecurrentLMDecoder`'s configuration, read and checked: what :func:`build_recurrent_decoder` builds.

    ``input``: the input layer (of width m, the LSTM's input); ``layer_sizes``: every LSTM layer's width, the last
    one the output's; ``weight_drop``, ``hidden_dropout``: the stack's; ``input_dropout``, ``output_dropout``,
    ``embed_dropout``, ``ar_alpha``, ``tar_beta``: the decoder's. The output layer is ``adaptive_softmax`` (fairseq's
    adaptive softmax, tied to the adaptive input when its spec says so) or, when that is None, a full softmax with a
    bias, tied to the input layer's ``V x n`` table when ``tie_full_softmax``.
    """

    input: InputLayerSpec
    layer_sizes: Tuple[int, ...]
    weight_drop: float
    hidden_dropout: float
    input_dropout: float
    output_dropout: float
    embed_dropout: float
    ar_alpha: float
    tar_beta: float
    tie_full_softmax: bool
    adaptive_softmax: Optional[AdaptiveSoftmaxSpec]

    @property
    def projects_out(self) -> bool:
        """A bias-free ``Linear(last layer, n)`` comes before the output layer: a tied one reads n features."""
        tied = self.tie_full_softmax or (self.adaptive_softmax is not None and self.adaptive_softmax.tied)
        return tied and self.layer_sizes[-1] != self.input.n


def locked_dropouts(cfg: Namespace) -> Dict[str, Tuple[float, str]]:
    """``{"input" | "hidden" | "output": (probability, the flag that set it)}``: ``--awd-*-dropout`` where given,
    else ``--dropout``."""
    dropouts = {}
    for where in ("input", "hidden", "output"):
        value = getattr(cfg, f"awd_{where}_dropout")
        dropouts[where] = (cfg.dropout, "--dropout") if value is None else (value, f"--awd-{where}-dropout")
    return dropouts


def resolve_recurrent_lm(cfg: Namespace, dictionary, adaptive: bool, tie_full_softmax: bool) -> RecurrentLMSpec:
    """The decoder that ``cfg`` describes (a namespace of ``LSTMLMDefineConfig``'s or ``AWDLSTMLMConfig``'s fields;
    the adaptive ones are read only when ``adaptive``) over ``dictionary``, every flag checked and nothing built.
    ``tie_full_softmax``: the family's flag for tying a full softmax to the V x n table is set.

    The input layer is the map (a V x n table or an adaptive input), with a DeFINE unit n -> m under
    ``--input-layer define``, or a projective map. Raises ``ValueError`` naming the flag for every impossible value
    or combination.
    """
    layer = resolve_input_layer(
        cfg, dictionary, cfg.decoder_embed_dim, "--decoder-embed-dim", table_init=awd_table_init, adaptive_map=adaptive
    )
    hidden = check_positive(cfg.decoder_hidden_size, "--decoder-hidden-size")
    count = check_positive(cfg.decoder_layers, "--decoder-layers")
    last = layer.n if cfg.decoder_output_dim is None else check_positive(cfg.decoder_output_dim, "--decoder-output-dim")
    dropouts = {where: check_probability(*picked) for where, picked in locked_dropouts(cfg).items()}
    softmax = None
    if adaptive:
        if cfg.adaptive_input_cutoff and not cfg.adaptive_input:
            raise ValueError(
                "--adaptive-input-cutoff is given without --adaptive-input; add --adaptive-input or drop it"
            )
        if cfg.tie_adaptive_proj and not cfg.tie_adaptive_weights:
            raise ValueError("--tie-adaptive-proj needs --tie-adaptive-weights")
        softmax = resolve_adaptive_softmax(cfg, layer.vocab, last, tied_to=layer if cfg.tie_adaptive_weights else None)
        if softmax is None and cfg.tie_adaptive_weights:
            raise ValueError("--tie-adaptive-weights needs an adaptive softmax (--adaptive-softmax-cutoff)")
    if tie_full_softmax:
        if softmax is not None:
            raise ValueError(
                "--share-decoder-input-output-embed ties a full softmax; to tie the adaptive softmax "
                "(--adaptive-softmax-cutoff) use --tie-adaptive-weights instead"
            )
        check_tie(layer, "--share-decoder-input-output-embed")
    return RecurrentLMSpec(
        input=layer,
        layer_sizes=(hidden,) * (count - 1) + (last,),
        weight_drop=check_probability(cfg.awd_weight_drop, "--awd-weight-drop"),
        hidden_dropout=dropouts["hidden"],
        input_dropout=dropouts["input"],
        output_dropout=dropouts["output"],
        embed_dropout=check_probability(cfg.awd_embed_dropout, "--awd-embed-dropout"),
        ar_alpha=check_nonnegative(cfg.awd_ar_alpha, "--awd-ar-alpha"),
        tar_beta=check_nonnegative(cfg.awd_tar_beta, "--awd-tar-beta"),
        tie_full_softmax=bool(tie_full_softmax),
        adaptive_softmax=softmax,
    )


def build_recurrent_decoder(spec: RecurrentLMSpec, dictionary) -> RecurrentLMDecoder:
    """The decoder ``spec`` describes (of :func:`resolve_recurrent_lm`, which checked it), over ``dictionary``.

    Shapes: as :class:`RecurrentLMDecoder`'s.
    """
    layer = build_input_layer(spec.input)
    lstm = LSTMStack(
        spec.input.width, spec.layer_sizes, weight_drop=spec.weight_drop, hidden_dropout=spec.hidden_dropout
    )
    last, n, vocab = spec.layer_sizes[-1], layer.tied_width, len(dictionary)
    # created in this order (projection, output layer) so that a seed gives the weights it always gave
    project_out_dim = nn.Linear(last, n, bias=False) if spec.projects_out else None
    output_projection = adaptive_softmax = None
    if spec.adaptive_softmax is not None:
        adaptive_softmax = build_adaptive_softmax(spec.adaptive_softmax, layer.embed)
    elif spec.tie_full_softmax:
        output_projection = tie_output(layer, nn.Linear(n, vocab, bias=True), "--share-decoder-input-output-embed")
    else:
        output_projection = nn.Linear(last, vocab, bias=True)
        nn.init.normal_(output_projection.weight, mean=0.0, std=last**-0.5)
    if output_projection is not None:
        nn.init.zeros_(output_projection.bias)
    if project_out_dim is not None:
        nn.init.xavier_uniform_(project_out_dim.weight)
    return RecurrentLMDecoder(
        dictionary,
        layer.embed,
        lstm,
        output_projection=output_projection,
        adaptive_softmax=adaptive_softmax,
        project_out_dim=project_out_dim,
        input_dropout=spec.input_dropout,
        output_dropout=spec.output_dropout,
        embed_dropout=spec.embed_dropout,
        ar_alpha=spec.ar_alpha,
        tar_beta=spec.tar_beta,
    )
