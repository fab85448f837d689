"""``mogrifier_lstm_lm``: the Mogrifier LSTM language model (Melis, Kočiský and Blunsom, ICLR 2020).

The model, from tokens to the vocabulary::

    V x e table (or, with --input-layer define, a V x n table and a DeFINE unit n -> e)
    -> MogrifierLSTM stack (e -> H -> ... -> H; input / inter-layer / state / output dropout inside it;
       the output is the top layer's or, with --mogrifier-sum-layer-outputs, the sum of all layers' outputs)
    -> output layer tied to the table (:class:`~define_fairseq.modules.tied_output.TiedOutput`):
         one softmax:  [bias-free projection H -> e when H != e] -> dropout -> x E^T + b
         K > 1 (--mogrifier-mos-components, mixture of softmaxes):  p_k = tanh(W_k x + c_k) in e dims, prior
         softmax(U x); P = sum_k prior_k softmax(dropout(p_k) E^T + b)

Everything follows the official code (DeepMind's lamb, whose tuned configs the archs below copy):

* the mixture of softmaxes is lamb's (a tanh projection with a bias to K x e, a bias-free prior, one tied table
  and one bias shared by the components);
* the dropout after the projection (``--mogrifier-projection-dropout``) is lamb's ``downprojected_output_dropout``,
  which defaults to the output dropout; with H = e and one softmax there is no projection and no second dropout;
* the dropout masks are those of lamb's configs (``shared_mask_dropout False``): the input, inter-layer, output and
  projection dropout draw a new mask at every time step; the state dropout draws one mask per layer and BPTT window
  (``--mogrifier-state-dropout-mask window``, the PTB archs: lamb unrolls the window statically) or a new one at
  every step (``step``, the WikiText-2 archs: lamb runs them as a ``dynamic_rnn`` loop).
  ``--mogrifier-shared-mask-dropout`` shares the input, inter-layer, output and projection masks over the window
  (variational dropout);
* ``--mogrifier-softmax-temperature T`` divides the logits by T in eval mode only (in ``get_normalized_probs``;
  with a mixture, each component's logits in the output layer, as lamb does), so ``fairseq-eval-lm --model-overrides
  "{'mogrifier_softmax_temperature': T}"`` scores with it. Note that lamb multiplies the logits by its
  ``eval_softmax_temperature`` t, so lamb's t is 1 / T here;
* ``--mogrifier-drop-state-probability p``: in training, each stream's carried state is reset to zeros with
  probability p before a batch (lamb's ``drop_state_probability``: a Bernoulli mask over the batch rows). The draws
  use torch's random generator, which fairseq seeds with ``--seed`` plus the update number;
* on a GPU each BPTT window of the stack replays as CUDA graphs (see
  :mod:`define_fairseq.modules.mogrifier.graphs`), unless ``--mogrifier-no-cuda-graphs``;
* ``--mogrifier-l2-penalty l``: lamb's ``l2_penalty``, the term ``l / 2 * sum(theta^2)`` over all parameters added
  to the loss (not fairseq's ``--weight-decay``, which in fairseq's Adam is decoupled weight decay). It reaches the
  loss through ``extra["regularization"]``: train with ``--criterion lm_regularized_loss``, and with
  ``--sentence-avg`` for lamb's normalisation (its loss is the sum over the BPTT window, averaged over the
  streams, plus the penalty once), see ``recipes/ptb/README.md``.

State: with the ``stateful_lm`` task the final state of a batch starts the next one (truncated BPTT; see
:mod:`define_fairseq.models.carried_state`); with ``language_modeling`` every batch starts from zeros. Generation
(``fairseq-generate``/``fairseq-interactive --task language_modeling``) decodes incrementally, one token at a
time, with the per-layer ``(h, c)`` cached and reordered by beam search.

The parameter budgets of the archs follow lamb: a total budget (all parameters: table, cell, mogrifier matrices,
projection, mixture, softmax bias) and the largest hidden size whose model fits it, computed for the paper's
vocabulary (10,000 words for PTB, 33,278 for WikiText-2); see each arch's docstring.
"""

from dataclasses import dataclass, field
from typing import Optional, Tuple

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.utils import safe_getattr

from define_fairseq.models.compile import CompileConfig
from define_fairseq.models.input_config import InputLayerConfig
from define_fairseq.models.input_layer import InputLayerLanguageModel
from define_fairseq.models.mogrifier_lm_decoder import STATE_MASKS, build_mogrifier_decoder, resolve_mogrifier_lm
from define_fairseq.modules.mogrifier.layer import KERNELS


@dataclass
class MogrifierLSTMLMConfig(InputLayerConfig, CompileConfig):
    """Options of ``mogrifier_lstm_lm`` (the DeFINE fields apply with ``--input-layer define`` only)."""

    mogrifier_layers: int = field(default=2, metadata={"help": "number of Mogrifier LSTM layers"})
    mogrifier_hidden_size: int = field(default=512, metadata={"help": "hidden size H of every layer"})
    mogrifier_embed_dim: Optional[int] = field(
        default=None,
        metadata={
            "help": "width e of the embeddings fed to the first layer (the table's width, or "
            "the DeFINE output width); default: the hidden size"
        },
    )
    mogrifier_rounds: int = field(
        default=5,
        metadata={
            "help": "mogrifier rounds r (0: a plain LSTM); odd rounds gate the input with the "
            "state, even rounds the state with the input"
        },
    )
    mogrifier_rank: int = field(
        default=0, metadata={"help": "rank k of each round's matrix (0: full rank; else 0 < k < min(e, H))"}
    )
    mogrifier_input_dropout: float = field(default=0.0, metadata={"help": "dropout on the first layer's input"})
    mogrifier_inter_layer_dropout: float = field(
        default=0.0, metadata={"help": "dropout on the input of layers 2 and above"}
    )
    mogrifier_state_dropout: float = field(
        default=0.0, metadata={"help": "dropout on the recurrent state h before the mogrifier rounds"}
    )
    mogrifier_output_dropout: float = field(
        default=0.0, metadata={"help": "dropout on the stack's output, before the output layer"}
    )
    mogrifier_projection_dropout: Optional[float] = field(
        default=None,
        metadata={
            "help": "dropout on the output projection's result (H -> e, or the mixture "
            "components) before the softmax; default: --mogrifier-output-dropout "
            "(lamb's downprojected_output_dropout)"
        },
    )
    mogrifier_shared_mask_dropout: bool = field(
        default=False,
        metadata={
            "help": "one mask per BPTT window, shared by its time steps, for the input, "
            "inter-layer, output and projection dropout (variational dropout; lamb's "
            "shared_mask_dropout); default: a new mask at every step, as lamb's configs"
        },
    )
    mogrifier_state_dropout_mask: ChoiceEnum(STATE_MASKS) = field(
        default="window",
        metadata={
            "help": "state dropout: one mask per layer and BPTT window, shared by its steps "
            "(lamb's static_rnn, as in its PTB configs), or a new mask at every step "
            "(its dynamic_rnn, as in its WikiText-2 configs)"
        },
    )
    mogrifier_no_cap_input_gate: bool = field(
        default=False,
        metadata={
            "help": "use the textbook c = f*c + i*j instead of lamb's capped input gate c = f*c + min(1 - f, i)*j"
        },
    )
    mogrifier_forget_bias: float = field(default=1.0, metadata={"help": "initial forget gate bias"})
    mogrifier_sum_layer_outputs: bool = field(
        default=False,
        metadata={
            "help": "the stack's output is the sum of every layer's output (lamb's skip "
            "connection) instead of the top layer's"
        },
    )
    mogrifier_softmax_temperature: float = field(
        default=1.0,
        metadata={
            "help": "eval mode only: divide the logits by this temperature (each component's "
            "logits with a mixture); e.g. fairseq-eval-lm --model-overrides "
            "\"{'mogrifier_softmax_temperature': 1.1}\""
        },
    )
    mogrifier_mos_components: int = field(
        default=1, metadata={"help": "mixture of softmaxes with this many components (1: one softmax)"}
    )
    mogrifier_drop_state_probability: float = field(
        default=0.0,
        metadata={
            "help": "training only: reset each stream's carried state to zeros with this "
            "probability before a batch (--task stateful_lm)"
        },
    )
    mogrifier_no_cuda_graphs: bool = field(
        default=False,
        metadata={
            "help": "on a GPU, run each BPTT window of the Mogrifier LSTM eagerly (thousands of small kernel "
            "launches) instead of replaying it as CUDA graphs, one per window shape (forward and backward in "
            "training, the forward in evaluation); the computed function is the same. The graphs check "
            "themselves against the eager path on their first call and fall back to it with a warning"
        },
    )
    mogrifier_kernels: ChoiceEnum(KERNELS) = field(
        default="auto",
        metadata={
            "help": "the per-step work of a layer with rounds: auto (Triton kernels on a GPU, checked against torch "
            "on their first call, with a fallback), triton (always, unchecked) or torch (never); "
            "DEFINE_FAIRSEQ_EAGER=1 runs every accelerated path of the plugin eagerly"
        },
    )
    mogrifier_l2_penalty: float = field(
        default=0.0,
        metadata={
            "help": "lamb's l2_penalty: add l/2 * sum(theta^2) over all parameters to the loss "
            "(needs --criterion lm_regularized_loss; it is added once per sample_size "
            "unit: per stream with --sentence-avg, as lamb, per token without)"
        },
    )


@register_model("mogrifier_lstm_lm", dataclass=MogrifierLSTMLMConfig)
class MogrifierLSTMLMModel(InputLayerLanguageModel):
    """Mogrifier LSTM language model (see the module docstring).

    ``forward(src_tokens [B, T], src_lengths=None, reset_state=None, incremental_state=None)`` as
    :class:`~define_fairseq.models.mogrifier_lm_decoder.MogrifierLMDecoder`.
    """

    config_class = MogrifierLSTMLMConfig
    resolve = staticmethod(resolve_mogrifier_lm)
    build_decoder = staticmethod(build_mogrifier_decoder)


def lamb_base(args):
    """What lamb's tuned 2-layer configs share (the Mogrifier paper's Sec. 4 and its code, ``lamb``), the base of
    the four archs below: 2 layers, lamb's capped input gate, forget bias 1, the stack's output the sum of both
    layers' outputs, the carried state dropped with probability 0.01, dropout masks new at every step (one state mask
    per BPTT window), one softmax tied to embeddings as wide as the hidden state."""
    args.mogrifier_layers = safe_getattr(args, "mogrifier_layers", 2)
    args.mogrifier_no_cap_input_gate = safe_getattr(args, "mogrifier_no_cap_input_gate", False)
    args.mogrifier_forget_bias = safe_getattr(args, "mogrifier_forget_bias", 1.0)
    args.mogrifier_sum_layer_outputs = safe_getattr(args, "mogrifier_sum_layer_outputs", True)
    args.mogrifier_drop_state_probability = safe_getattr(args, "mogrifier_drop_state_probability", 0.01)
    args.mogrifier_shared_mask_dropout = safe_getattr(args, "mogrifier_shared_mask_dropout", False)
    args.mogrifier_state_dropout_mask = safe_getattr(args, "mogrifier_state_dropout_mask", "window")
    args.mogrifier_embed_dim = safe_getattr(args, "mogrifier_embed_dim", None)
    args.mogrifier_mos_components = safe_getattr(args, "mogrifier_mos_components", 1)


def lamb_wt2_base(args):
    """What lamb's WikiText-2 configs add to :func:`lamb_base`: a mixture of 2 softmaxes, and one state mask per
    step, as lamb runs them as a dynamic_rnn (swap_memory True)."""
    args.mogrifier_mos_components = safe_getattr(args, "mogrifier_mos_components", 2)
    args.mogrifier_state_dropout_mask = safe_getattr(args, "mogrifier_state_dropout_mask", "step")
    lamb_base(args)


def lamb_tuned(args, hidden_size: int, rounds: int, rank: int, dropout: Tuple[float, float, float, float]):
    """The values lamb tuned for each of the archs below: the width, the Mogrifier rounds and rank (0 and 0 for a
    plain LSTM), and the dropout on the input, between the layers, on the state and on the output."""
    args.mogrifier_hidden_size = safe_getattr(args, "mogrifier_hidden_size", hidden_size)
    args.mogrifier_rounds = safe_getattr(args, "mogrifier_rounds", rounds)
    args.mogrifier_rank = safe_getattr(args, "mogrifier_rank", rank)
    args.mogrifier_input_dropout = safe_getattr(args, "mogrifier_input_dropout", dropout[0])
    args.mogrifier_inter_layer_dropout = safe_getattr(args, "mogrifier_inter_layer_dropout", dropout[1])
    args.mogrifier_state_dropout = safe_getattr(args, "mogrifier_state_dropout", dropout[2])
    args.mogrifier_output_dropout = safe_getattr(args, "mogrifier_output_dropout", dropout[3])


@register_model_architecture("mogrifier_lstm_lm", "mogrifier_lstm_lm_ptb")
def mogrifier_lstm_lm_ptb(args):
    """lamb's tuned PTB Mogrifier (``tune_ptb_24m_lstm_fm_d2_arms/trial_483``): r = 5, k = 84, dropout input .729 /
    inter-layer .291 / state .387 / output .716 (lr 2.30e-3 and L2 2.52e-4 are in ``recipes/ptb/train.sh``).

    Budget 24M at V = 10,000: with H = e = n the model has V n + V (table, softmax bias) and per layer 8 n^2 + 4 n
    (LSTM) + 5 (2 k n + n) (five rounds of rank-k factors with a bias), i.e. 16 n^2 + (V + 18 + 20 k) n + V
    parameters; n = 912 is the largest that fits (23,986,480); n = 913 would give 24,027,378.
    """
    lamb_tuned(args, hidden_size=912, rounds=5, rank=84, dropout=(0.729, 0.291, 0.387, 0.716))
    lamb_base(args)


@register_model_architecture("mogrifier_lstm_lm", "mogrifier_lstm_lm_baseline_ptb")
def mogrifier_lstm_lm_baseline_ptb(args):
    """lamb's tuned PTB LSTM baseline (``tune_ptb_24m_lstm_d2_arms/trial_833``): r = 0 (a plain LSTM with the
    capped input gate), dropout input .628 / inter-layer .307 / state .369 / output .690 (lr 3.04e-3 and L2 2.49e-4
    are in ``recipes/ptb/train.sh``).

    Budget 24M at V = 10,000: 16 n^2 + (V + 8) n + V parameters; n = 951 is the largest that fits (23,998,024;
    n = 952 would give 24,038,480).
    """
    lamb_tuned(args, hidden_size=951, rounds=0, rank=0, dropout=(0.628, 0.307, 0.369, 0.69))
    lamb_base(args)


@register_model_architecture("mogrifier_lstm_lm", "mogrifier_lstm_lm_wt2")
def mogrifier_lstm_lm_wt2(args):
    """lamb's tuned WikiText-2 Mogrifier (``tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747``): r = 6, k = 48,
    embeddings e = round(0.1993 n), a mixture of 2 softmaxes tied to the embeddings, one state mask per step,
    dropout input .547 / inter-layer .199 / state .221 / output .348 (lr 3.29e-3 and L2 1.90e-4 are in
    ``recipes/wikitext-2/train.sh``).

    Budget 35M at V = 33,278: table V e + softmax bias V; layer 1 4 n (e + n) + 4 n + 6 k (e + n) + 3 (e + n);
    layer 2 8 n^2 + 4 n + 12 k n + 6 n; mixture 2 e n + 2 e (projection) + 2 n (prior). n = 1366 with e = 272 is
    the largest that fits (34,991,552 parameters; n = 1367, e = 272 would give 35,026,863).
    """
    args.mogrifier_embed_dim = safe_getattr(args, "mogrifier_embed_dim", 272)
    lamb_tuned(args, hidden_size=1366, rounds=6, rank=48, dropout=(0.547, 0.199, 0.221, 0.348))
    lamb_wt2_base(args)


@register_model_architecture("mogrifier_lstm_lm", "mogrifier_lstm_lm_baseline_wt2")
def mogrifier_lstm_lm_baseline_wt2(args):
    """lamb's tuned WikiText-2 LSTM baseline (``tune_wikitext-2_35m_lstm_mos2_d2_arms/trial_763``): r = 0,
    embeddings e = round(0.3531 n), a mixture of 2 softmaxes, one state mask per step, dropout input .609 /
    inter-layer .091 / state .271 / output .348 (lr 3.18e-3 and L2 2.31e-4 are in ``recipes/wikitext-2/train.sh``).

    Budget 35M at V = 33,278: the Mogrifier WT2 count without the rounds; n = 1211 with e = 428 is the largest
    that fits (34,997,328 parameters; n = 1212, e = 428 would give 35,028,982).
    """
    args.mogrifier_embed_dim = safe_getattr(args, "mogrifier_embed_dim", 428)
    lamb_tuned(args, hidden_size=1211, rounds=0, rank=0, dropout=(0.609, 0.091, 0.271, 0.348))
    lamb_wt2_base(args)
