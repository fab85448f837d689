"""``lstm_lm_define``: the DeFINE paper's LSTM language model for WikiText-103 (Mehta et al., 2020, Table 1a).

The model, from tokens to the vocabulary::

    map (V x n table, or adaptive input of width n)  ->  DeFINE unit n -> m (``--define-depth`` > 0)
    -> LSTM stack m -> hidden -> ... -> last layer (``--decoder-output-dim``, default n)
    -> [bias-free projection to n when the last layer is not n and the output is tied]
    -> full softmax (V x n, tied to the table, with a bias) or adaptive softmax (tied to the adaptive input,
       projections included)

The paper's archs (4 LSTM layers of 1024, the last of size m; adaptive cutoffs 20000,40000,200000, factor 4):

============================  ========================================  =====  =====
arch                          input / output                            N      n = m
============================  ========================================  =====  =====
``lstm_lm_standard_wt103``    V x 256 table, tied full softmax + bias   --     256
``lstm_lm_adaptive_wt103``    adaptive input / tied adaptive softmax    --     256
``lstm_lm_define_wt103_n3``   adaptive + DeFINE, k = 1024               3      256
``lstm_lm_define_wt103_n7``   adaptive + DeFINE, k = 1024               7      384
``lstm_lm_define_wt103_n11``  adaptive + DeFINE, k = 1024               11     512
============================  ========================================  =====  =====

Dropout follows Merity et al. (2018a) on WikiText-103 (locked dropout 0.1 on the LSTM input, between layers and
on the output); every AWD-LSTM regulariser of :mod:`define_fairseq.models.awd_lstm_lm` is available here as
well (``--define-weight-drop`` etc., all off by default). Use ``--criterion adaptive_loss --ddp-backend
legacy_ddp`` (or ``lm_regularized_loss``) with an adaptive softmax.

State: with the ``stateful_lm`` task the final LSTM state of a batch starts the next one (truncated BPTT; see
:mod:`define_fairseq.models.carried_state`); with ``language_modeling`` every batch starts from zeros.
Generation (``fairseq-generate``/``fairseq-interactive --task language_modeling``) decodes incrementally.

:class:`RecurrentLMDecoder` and :func:`build_recurrent_decoder` are shared with ``awd_lstm_lm``.
"""

from argparse import Namespace
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
from fairseq.models import FairseqIncrementalDecoder, FairseqLanguageModel, register_model, register_model_architecture
from fairseq.modules import AdaptiveSoftmax
from fairseq.utils import safe_getattr
from torch import Tensor

from define_fairseq.models.carried_state import CarriedState, IncrementalLSTMState
from define_fairseq.models.config_helpers import (
    check_rate as _check_rate, check_tail_widths, config_namespace, parse_cutoff)
from define_fairseq.models.define_config import DeFINEConfig, define_embedding_kwargs
from define_fairseq.modules.adaptive_input import AdaptiveInput, check_cutoff
from define_fairseq.modules.define_embedding import DeFINEEmbedding, FoldedDeFINEEmbedding
from define_fairseq.modules.locked_dropout import locked_dropout
from define_fairseq.modules.lstm_stack import LSTMStack
from define_fairseq.modules.weight_drop import embedding_dropout


MAX_POSITIONS = 1_000_000  # a recurrent model has no length limit


@dataclass
class RecurrentLMConfig(DeFINEConfig):
    """Options shared by the recurrent language models of the plugin (``lstm_lm_define``, ``awd_lstm_lm``)."""

    define_n: int = field(default=256, metadata={"help": "width n of the map (the V x n table / adaptive input); "
                                                         "the output layer is tied in n dimensions"})
    decoder_embed_dim: int = field(default=256, metadata={"help": "LSTM input width m (the DeFINE output width)"})
    decoder_hidden_size: int = field(default=1024, metadata={"help": "hidden size of every LSTM layer but the last"})
    decoder_layers: int = field(default=4, metadata={"help": "number of LSTM layers"})
    decoder_output_dim: Optional[int] = field(
        default=None, metadata={"help": "size of the last LSTM layer (default: n, the tied dimension)"})
    dropout: float = field(
        default=0.1, metadata={"help": "locked dropout on the LSTM input, between layers and on the output, "
                                       "wherever --define-input/hidden/output-dropout does not say otherwise"})
    define_input_dropout: Optional[float] = field(
        default=None, metadata={"help": "locked dropout on the embeddings (AWD-LSTM dropouti); default --dropout"})
    define_hidden_dropout: Optional[float] = field(
        default=None, metadata={"help": "locked dropout between LSTM layers (AWD-LSTM dropouth); default --dropout"})
    define_output_dropout: Optional[float] = field(
        default=None, metadata={"help": "locked dropout on the last LSTM layer's output (AWD-LSTM dropout); "
                                        "default --dropout"})
    define_embed_dropout: float = field(
        default=0.0, metadata={"help": "embedding dropout: drop whole words (AWD-LSTM dropoute)"})
    define_weight_drop: float = field(
        default=0.0, metadata={"help": "DropConnect on the hidden-to-hidden matrices (AWD-LSTM wdrop)"})
    define_ar_alpha: float = field(
        default=0.0, metadata={"help": "activation regularisation: alpha * mean(dropped last-layer output^2)"})
    define_tar_beta: float = field(
        default=0.0, metadata={"help": "temporal activation regularisation: beta * mean((h_t - h_{t-1})^2) of the "
                                       "last layer's output before dropout"})


@dataclass
class LSTMLMDefineConfig(RecurrentLMConfig):
    adaptive_input: bool = field(default=False, metadata={"help": "map tokens with an adaptive input of width n"})
    adaptive_input_cutoff: Optional[str] = field(
        default=None, metadata={"help": "comma separated adaptive input band boundaries, e.g. 20000,40000,200000"})
    adaptive_input_factor: float = field(default=4, metadata={"help": "adaptive input: width divisor per band"})
    adaptive_softmax_cutoff: Optional[str] = field(
        default=None, metadata={"help": "comma separated adaptive softmax cutoffs (none: full softmax); use "
                                        "--criterion adaptive_loss or lm_regularized_loss"})
    adaptive_softmax_factor: float = field(default=4, metadata={"help": "adaptive softmax: width divisor per band"})
    adaptive_softmax_dropout: float = field(
        default=0.0, metadata={"help": "dropout inside the adaptive softmax tail clusters"})
    tie_adaptive_weights: bool = field(
        default=False, metadata={"help": "tie the adaptive softmax to the adaptive input (same cutoffs, factor)"})
    tie_adaptive_proj: bool = field(
        default=False, metadata={"help": "tie the adaptive softmax tail projections to the adaptive input's too"})
    share_decoder_input_output_embed: bool = field(
        default=False, metadata={"help": "tie the full softmax to the V x n table"})


class RecurrentLMDecoder(IncrementalLSTMState, FairseqIncrementalDecoder):
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

    def __init__(self, dictionary, embed_tokens: nn.Module, lstm: LSTMStack,
                 output_projection: Optional[nn.Linear] = None, adaptive_softmax: Optional[AdaptiveSoftmax] = None,
                 project_out_dim: Optional[nn.Linear] = None, input_dropout: float = 0.0,
                 output_dropout: float = 0.0, embed_dropout: float = 0.0, ar_alpha: float = 0.0,
                 tar_beta: float = 0.0):
        super().__init__(dictionary)
        if embed_tokens.embedding_dim != lstm.input_size:
            raise ValueError(f"the embedding gives {embed_tokens.embedding_dim} features (the DeFINE output width m, "
                             f"--decoder-embed-dim) but the first LSTM layer takes {lstm.input_size}; they must match")
        if (output_projection is None) == (adaptive_softmax is None):
            raise ValueError("give exactly one of output_projection (full softmax) and adaptive_softmax")
        for value, what in ((input_dropout, "input dropout"), (output_dropout, "output dropout"),
                            (embed_dropout, "embedding dropout")):
            _check_rate(value, what)
        if ar_alpha < 0 or tar_beta < 0:
            raise ValueError(f"--define-ar-alpha ({ar_alpha}) and --define-tar-beta ({tar_beta}) must be >= 0")
        self.embed_tokens = embed_tokens
        self.lstm = lstm
        self.project_out_dim = project_out_dim
        self.output_projection = output_projection
        self.adaptive_softmax = adaptive_softmax
        self.input_dropout = input_dropout
        self.output_dropout = output_dropout
        self.embed_dropout = embed_dropout
        self.ar_alpha = ar_alpha
        self.tar_beta = tar_beta
        self.padding_idx = dictionary.pad()
        self.carried_state = CarriedState("LSTM state")  # its training state is saved in checkpoints

    # -- forward -------------------------------------------------------------------------------------------

    def forward(self, prev_output_tokens, src_lengths=None, reset_state=None, incremental_state=None,
                features_only: bool = False, **unused):
        x, extra = self.extract_features(prev_output_tokens, reset_state=reset_state,
                                         incremental_state=incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens, reset_state=None, incremental_state=None, **unused):
        tokens = prev_output_tokens
        if incremental_state is not None:
            state = self._cached_state(incremental_state)
            if state is not None:
                tokens = tokens[:, -1:]
        else:
            state = self.carried_state.initial(reset_state, self.training, tokens.size(0))

        x = self.embed_tokens(tokens)
        x = embedding_dropout(x, tokens, len(self.dictionary), self.embed_dropout, self.training)
        x = locked_dropout(x, self.input_dropout, self.training)
        raw, final_state = self.lstm(x, state)
        x = locked_dropout(raw, self.output_dropout, self.training)

        if incremental_state is not None:
            self._cache_state(incremental_state, final_state)
        else:
            self.carried_state.keep(reset_state, self.training, tokens.size(0), final_state)

        extra = {"attn": None}
        if self.training and (self.ar_alpha > 0 or self.tar_beta > 0):
            extra["regularization"] = self.activation_regularization(x, raw, tokens.ne(self.padding_idx))
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, extra

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

    def max_positions(self):
        return MAX_POSITIONS


def build_recurrent_decoder(cfg: Namespace, dictionary, adaptive: bool, tie_full_softmax: bool) -> RecurrentLMDecoder:
    """The decoder described by ``cfg`` (a namespace of :class:`RecurrentLMConfig` fields, plus those of
    :class:`LSTMLMDefineConfig` when ``adaptive``). ``tie_full_softmax``: tie a full softmax to the V x n table.

    Raises ``ValueError`` naming the flag for every impossible combination.
    """
    vocab, pad = len(dictionary), dictionary.pad()
    n, m, depth = cfg.define_n, cfg.decoder_embed_dim, cfg.define_depth
    for name in ("define_n", "decoder_embed_dim", "decoder_hidden_size", "decoder_layers"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(cfg, name)} must be at least 1")
    if cfg.decoder_output_dim is not None and cfg.decoder_output_dim < 1:
        raise ValueError(f"--decoder-output-dim={cfg.decoder_output_dim} must be at least 1")
    if depth < 0:
        raise ValueError(f"--define-depth={depth} must be >= 0 (0: no DeFINE unit)")
    if depth == 0 and n != m:
        raise ValueError(f"--define-depth 0 (no DeFINE unit) feeds the map straight into the LSTM, so --define-n "
                         f"({n}) must equal --decoder-embed-dim ({m}); set them equal or use --define-depth > 0")
    if depth == 0 and cfg.define_folded:
        raise ValueError("--define-folded needs a DeFINE unit (--define-depth > 0)")
    rates = {"--dropout": cfg.dropout, "--define-embed-dropout": cfg.define_embed_dropout,
             "--define-weight-drop": cfg.define_weight_drop}
    dropouts = {}
    for where in ("input", "hidden", "output"):
        value = getattr(cfg, f"define_{where}_dropout")
        dropouts[where] = cfg.dropout if value is None else value
        rates[f"--define-{where}-dropout"] = dropouts[where]
    if adaptive:
        rates["--adaptive-softmax-dropout"] = cfg.adaptive_softmax_dropout
    for flag, value in rates.items():
        _check_rate(value, flag)

    # map (+ DeFINE)
    input_cutoff = None
    use_adaptive_input = adaptive and cfg.adaptive_input
    if use_adaptive_input:
        if not cfg.adaptive_input_cutoff:
            raise ValueError("--adaptive-input needs --adaptive-input-cutoff (e.g. 20000,40000,200000)")
        input_cutoff = check_cutoff(parse_cutoff(cfg.adaptive_input_cutoff, "--adaptive-input-cutoff"), vocab,
                                    "--adaptive-input-cutoff")
    elif adaptive and cfg.adaptive_input_cutoff:
        raise ValueError("--adaptive-input-cutoff is given without --adaptive-input; add --adaptive-input or drop it")
    if depth == 0:
        if use_adaptive_input:
            embed = AdaptiveInput(vocab, pad, n, input_cutoff, cfg.adaptive_input_factor, output_dim=n)
        else:
            embed = nn.Embedding(vocab, n, padding_idx=pad)
            nn.init.uniform_(embed.weight, -0.1, 0.1)  # AWD-LSTM's initialisation
            with torch.no_grad():
                embed.weight[pad].zero_()
    elif cfg.define_folded:
        if use_adaptive_input:
            raise ValueError("--define-folded is not supported with --adaptive-input (the DeFINE embedding already "
                             "computes its V x m table once in eval mode)")
        embed = FoldedDeFINEEmbedding(vocab, n, m, padding_idx=pad)
    else:
        embed = DeFINEEmbedding(vocab, padding_idx=pad, adaptive_cutoff=input_cutoff,
                                adaptive_factor=cfg.adaptive_input_factor if use_adaptive_input else 4,
                                **define_embedding_kwargs(cfg, m))

    # LSTM stack
    last = cfg.decoder_output_dim if cfg.decoder_output_dim is not None else n
    lstm = LSTMStack(m, [cfg.decoder_hidden_size] * (cfg.decoder_layers - 1) + [last],
                     weight_drop=cfg.define_weight_drop, hidden_dropout=dropouts["hidden"])

    # output layer
    project_out_dim = output_projection = adaptive_softmax = None
    softmax_cutoff = cfg.adaptive_softmax_cutoff if adaptive else None
    if adaptive and cfg.tie_adaptive_proj and not cfg.tie_adaptive_weights:
        raise ValueError("--tie-adaptive-proj needs --tie-adaptive-weights")
    if softmax_cutoff:
        cutoff = check_cutoff(parse_cutoff(softmax_cutoff, "--adaptive-softmax-cutoff"), vocab,
                              "--adaptive-softmax-cutoff")
        if tie_full_softmax:
            raise ValueError("--share-decoder-input-output-embed ties a full softmax; to tie the adaptive softmax "
                             "(--adaptive-softmax-cutoff) use --tie-adaptive-weights instead")
        if cfg.tie_adaptive_weights:
            if not use_adaptive_input:
                raise ValueError("--tie-adaptive-weights needs --adaptive-input (the softmax ties to its bands)")
            if cutoff != input_cutoff:
                raise ValueError(f"--tie-adaptive-weights needs the same bands on both sides, but "
                                 f"--adaptive-softmax-cutoff {softmax_cutoff} differs from --adaptive-input-cutoff "
                                 f"{cfg.adaptive_input_cutoff}")
            if cfg.adaptive_softmax_factor != cfg.adaptive_input_factor:
                raise ValueError(f"--tie-adaptive-weights needs --adaptive-softmax-factor "
                                 f"({cfg.adaptive_softmax_factor}) equal to --adaptive-input-factor "
                                 f"({cfg.adaptive_input_factor})")
            if last != n:
                project_out_dim = nn.Linear(last, n, bias=False)
            adaptive_softmax = AdaptiveSoftmax(vocab, n, cutoff, cfg.adaptive_softmax_dropout,
                                               factor=cfg.adaptive_softmax_factor, adaptive_inputs=embed,
                                               tie_proj=cfg.tie_adaptive_proj)
        else:
            check_tail_widths(cutoff, last, cfg.adaptive_softmax_factor, softmax_cutoff)
            adaptive_softmax = AdaptiveSoftmax(vocab, last, cutoff, cfg.adaptive_softmax_dropout,
                                               factor=cfg.adaptive_softmax_factor)
    else:
        if adaptive and cfg.tie_adaptive_weights:
            raise ValueError("--tie-adaptive-weights needs an adaptive softmax (--adaptive-softmax-cutoff)")
        if tie_full_softmax:
            if use_adaptive_input:
                raise ValueError("a full softmax cannot be tied to an adaptive input (it has no single V x n "
                                 "table): add --adaptive-softmax-cutoff with --tie-adaptive-weights, or untie")
            if last != n:
                project_out_dim = nn.Linear(last, n, bias=False)
            output_projection = nn.Linear(n, vocab, bias=True)
            output_projection.weight = embed.weight
        else:
            output_projection = nn.Linear(last, vocab, bias=True)
            nn.init.normal_(output_projection.weight, mean=0.0, std=last ** -0.5)
        nn.init.zeros_(output_projection.bias)
    if project_out_dim is not None:
        nn.init.xavier_uniform_(project_out_dim.weight)

    return RecurrentLMDecoder(dictionary, embed, lstm, output_projection=output_projection,
                              adaptive_softmax=adaptive_softmax, project_out_dim=project_out_dim,
                              input_dropout=dropouts["input"], output_dropout=dropouts["output"],
                              embed_dropout=cfg.define_embed_dropout, ar_alpha=cfg.define_ar_alpha,
                              tar_beta=cfg.define_tar_beta)


@register_model("lstm_lm_define", dataclass=LSTMLMDefineConfig)
class LSTMLMDefineModel(FairseqLanguageModel):
    """LSTM language model with an optional DeFINE unit and adaptive input/softmax (see the module docstring).

    ``forward(src_tokens [B, T], src_lengths=None, reset_state=None, incremental_state=None)`` as
    :class:`RecurrentLMDecoder`.
    """

    @classmethod
    def build_model(cls, cfg, task):
        args = config_namespace(cfg, LSTMLMDefineConfig)
        return cls(build_recurrent_decoder(args, task.target_dictionary, adaptive=True,
                                           tie_full_softmax=args.share_decoder_input_output_embed))


def _wt103(args, n: int, depth: int, adaptive: bool):
    """Defaults common to the paper's WikiText-103 LSTM models (Table 1a, Table 9)."""
    args.define_n = safe_getattr(args, "define_n", n)
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", args.define_n)  # the paper has m = n
    args.define_depth = safe_getattr(args, "define_depth", depth)
    args.define_k = safe_getattr(args, "define_k", 1024)
    args.decoder_hidden_size = safe_getattr(args, "decoder_hidden_size", 1024)
    args.decoder_layers = safe_getattr(args, "decoder_layers", 4)
    args.dropout = safe_getattr(args, "dropout", 0.1)
    if adaptive:
        args.adaptive_input = safe_getattr(args, "adaptive_input", True)
        args.adaptive_input_cutoff = safe_getattr(args, "adaptive_input_cutoff", "20000,40000,200000")
        args.adaptive_input_factor = safe_getattr(args, "adaptive_input_factor", 4)
        args.adaptive_softmax_cutoff = safe_getattr(args, "adaptive_softmax_cutoff", "20000,40000,200000")
        args.adaptive_softmax_factor = safe_getattr(args, "adaptive_softmax_factor", 4)
        args.tie_adaptive_weights = safe_getattr(args, "tie_adaptive_weights", True)
        args.tie_adaptive_proj = safe_getattr(args, "tie_adaptive_proj", True)
    else:
        args.share_decoder_input_output_embed = safe_getattr(args, "share_decoder_input_output_embed", True)


@register_model_architecture("lstm_lm_define", "lstm_lm_standard_wt103")
def lstm_lm_standard_wt103(args):
    """Table 1a R1: V x 256 table, 4 LSTM layers (1024, 1024, 1024, 256), full softmax tied, with a bias."""
    _wt103(args, n=256, depth=0, adaptive=False)


@register_model_architecture("lstm_lm_define", "lstm_lm_adaptive_wt103")
def lstm_lm_adaptive_wt103(args):
    """Table 1a R2: adaptive input / tied adaptive softmax of width 256, no DeFINE."""
    _wt103(args, n=256, depth=0, adaptive=True)


@register_model_architecture("lstm_lm_define", "lstm_lm_define_wt103_n3")
def lstm_lm_define_wt103_n3(args):
    """Table 1a R3: adaptive input 256 -> DeFINE (N=3, k=1024) -> LSTM with m=256."""
    _wt103(args, n=256, depth=3, adaptive=True)


@register_model_architecture("lstm_lm_define", "lstm_lm_define_wt103_n7")
def lstm_lm_define_wt103_n7(args):
    """Table 1a R4: adaptive input 384 -> DeFINE (N=7, k=1024) -> LSTM with m=384."""
    _wt103(args, n=384, depth=7, adaptive=True)


@register_model_architecture("lstm_lm_define", "lstm_lm_define_wt103_n11")
def lstm_lm_define_wt103_n11(args):
    """Table 1a R5: adaptive input 512 -> DeFINE (N=11, k=1024) -> LSTM with m=512."""
    _wt103(args, n=512, depth=11, adaptive=True)
