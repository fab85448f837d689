"""The decoder of ``lstm_lm_define`` and ``awd_lstm_lm`` (:class:`RecurrentLMDecoder`) and the function that
builds it from the models' configuration (:func:`build_recurrent_decoder`)."""

from argparse import Namespace
from typing import Dict, Optional, Tuple

import torch.nn as nn
from fairseq.modules import AdaptiveSoftmax
from torch import Tensor

from define_fairseq.models.compile import compile_static_parts
from define_fairseq.models.config_helpers import (
    check_rate,
    check_tail_widths,
    check_tied_bands,
    flag_names,
    parse_cutoff,
)
from define_fairseq.models.input_layer import InputLayer, InputLayerSpec, resolve_input_layer, tie_output
from define_fairseq.models.recurrent_decoder import RecurrentDecoder
from define_fairseq.modules.awd_lstm.locked_dropout import locked_dropout
from define_fairseq.modules.awd_lstm.lstm_stack import LSTMStack
from define_fairseq.modules.awd_lstm.weight_drop import embedding_dropout
from define_fairseq.modules.checks import check_cutoff, check_probability


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
        if ar_alpha < 0 or tar_beta < 0:
            raise ValueError(f"--awd-ar-alpha ({ar_alpha}) and --awd-tar-beta ({tar_beta}) must be >= 0")
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


def check_recurrent_config(cfg: Namespace, adaptive: bool) -> None:
    """The checks of ``cfg`` that no module makes: sizes and combinations of flags (``ValueError`` naming them)."""
    for name in ("decoder_hidden_size", "decoder_layers"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(cfg, name)} must be at least 1")
    if cfg.decoder_output_dim is not None and cfg.decoder_output_dim < 1:
        raise ValueError(f"--decoder-output-dim={cfg.decoder_output_dim} must be at least 1")
    if adaptive and cfg.adaptive_input_cutoff and not cfg.adaptive_input:
        raise ValueError("--adaptive-input-cutoff is given without --adaptive-input; add --adaptive-input or drop it")
    if adaptive:
        check_rate(cfg.adaptive_softmax_dropout, "--adaptive-softmax-dropout")  # fairseq's AdaptiveSoftmax: unchecked
        if cfg.tie_adaptive_proj and not cfg.tie_adaptive_weights:
            raise ValueError("--tie-adaptive-proj needs --tie-adaptive-weights")


def locked_dropouts(cfg: Namespace) -> Dict[str, Tuple[float, str]]:
    """``{"input" | "hidden" | "output": (probability, the flag that set it)}``: ``--awd-*-dropout`` where given,
    else ``--dropout``."""
    dropouts = {}
    for where in ("input", "hidden", "output"):
        value = getattr(cfg, f"awd_{where}_dropout")
        dropouts[where] = (cfg.dropout, "--dropout") if value is None else (value, f"--awd-{where}-dropout")
    return dropouts


def awd_table_init(weight: Tensor) -> None:
    """AWD-LSTM's initialisation of the table: U(-0.1, 0.1)."""
    nn.init.uniform_(weight, -0.1, 0.1)


def build_recurrent_output(
    cfg: Namespace, dictionary, layer: InputLayer, last: int, adaptive: bool, tie_full_softmax: bool
):
    """``(output_projection, adaptive_softmax, project_out_dim)`` for a last LSTM layer of ``last`` units: a full
    softmax (tied to the input layer's V x n table or not) or fairseq's adaptive softmax (tied to the adaptive input
    or not)."""
    vocab, n, input_cutoff = len(dictionary), layer.tied_width, layer.adaptive_cutoff
    project_out_dim = output_projection = adaptive_softmax = None
    softmax_cutoff = cfg.adaptive_softmax_cutoff if adaptive else None
    if softmax_cutoff:
        cutoff = check_cutoff(
            parse_cutoff(softmax_cutoff, "--adaptive-softmax-cutoff"), vocab, "--adaptive-softmax-cutoff"
        )
        if tie_full_softmax:
            raise ValueError(
                "--share-decoder-input-output-embed ties a full softmax; to tie the adaptive softmax "
                "(--adaptive-softmax-cutoff) use --tie-adaptive-weights instead"
            )
        if cfg.tie_adaptive_weights:
            check_tied_bands(cfg, input_cutoff, cutoff)
            if last != n:
                project_out_dim = nn.Linear(last, n, bias=False)
            adaptive_softmax = AdaptiveSoftmax(
                vocab,
                n,
                cutoff,
                cfg.adaptive_softmax_dropout,
                factor=cfg.adaptive_softmax_factor,
                adaptive_inputs=layer.embed,
                tie_proj=cfg.tie_adaptive_proj,
            )
        else:
            check_tail_widths(cutoff, last, cfg.adaptive_softmax_factor, softmax_cutoff)
            adaptive_softmax = AdaptiveSoftmax(
                vocab, last, cutoff, cfg.adaptive_softmax_dropout, factor=cfg.adaptive_softmax_factor
            )
    else:
        if adaptive and cfg.tie_adaptive_weights:
            raise ValueError("--tie-adaptive-weights needs an adaptive softmax (--adaptive-softmax-cutoff)")
        if tie_full_softmax:
            if last != n:
                project_out_dim = nn.Linear(last, n, bias=False)
            output_projection = tie_output(layer, nn.Linear(n, vocab, bias=True), "--share-decoder-input-output-embed")
        else:
            output_projection = nn.Linear(last, vocab, bias=True)
            nn.init.normal_(output_projection.weight, mean=0.0, std=last**-0.5)
        nn.init.zeros_(output_projection.bias)
    if project_out_dim is not None:
        nn.init.xavier_uniform_(project_out_dim.weight)
    return output_projection, adaptive_softmax, project_out_dim


def recurrent_input_spec(cfg: Namespace, dictionary, adaptive: bool) -> InputLayerSpec:
    """The input layer of the recurrent decoder ``cfg`` describes: the map (a V x n table or an adaptive input), with
    a DeFINE unit n -> m under ``--input-layer define``, or a projective map."""
    return resolve_input_layer(
        cfg, dictionary, cfg.decoder_embed_dim, "--decoder-embed-dim", table_init=awd_table_init, adaptive_map=adaptive
    )


def build_recurrent_decoder(
    cfg: Namespace, dictionary, layer: InputLayer, adaptive: bool, tie_full_softmax: bool
) -> RecurrentLMDecoder:
    """The decoder described by ``cfg`` (a namespace of ``LSTMLMDefineConfig``'s or ``AWDLSTMLMConfig``'s fields;
    the adaptive ones are read only when ``adaptive``) over the input layer ``layer`` (of
    :func:`recurrent_input_spec`). ``tie_full_softmax``: tie a full softmax to the V x n table.

    Raises ``ValueError`` naming the flag for every impossible combination: the sizes and combinations here, the
    probabilities in the modules (each under the flag that set it).
    """
    check_recurrent_config(cfg, adaptive)
    dropouts = locked_dropouts(cfg)
    last = cfg.decoder_output_dim if cfg.decoder_output_dim is not None else layer.tied_width
    with flag_names(hidden_dropout=dropouts["hidden"][1], weight_drop="--awd-weight-drop"):
        lstm = LSTMStack(
            cfg.decoder_embed_dim,
            [cfg.decoder_hidden_size] * (cfg.decoder_layers - 1) + [last],
            weight_drop=cfg.awd_weight_drop,
            hidden_dropout=dropouts["hidden"][0],
        )
    output_projection, adaptive_softmax, project_out_dim = build_recurrent_output(
        cfg, dictionary, layer, last, adaptive, tie_full_softmax
    )
    with flag_names(
        input_dropout=dropouts["input"][1], output_dropout=dropouts["output"][1], embed_dropout="--awd-embed-dropout"
    ):
        decoder = RecurrentLMDecoder(
            dictionary,
            layer.embed,
            lstm,
            output_projection=output_projection,
            adaptive_softmax=adaptive_softmax,
            project_out_dim=project_out_dim,
            input_dropout=dropouts["input"][0],
            output_dropout=dropouts["output"][0],
            embed_dropout=cfg.awd_embed_dropout,
            ar_alpha=cfg.awd_ar_alpha,
            tar_beta=cfg.awd_tar_beta,
        )
    return compile_static_parts(decoder, cfg)
