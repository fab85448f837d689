"""The Mogrifier paper's configs fill their parameter budgets (24M PTB, 35M WikiText-2) with the largest hidden size
that fits, counted as the official code counts them, and carry lamb's tuned dropouts and mask settings."""

import pytest
import torch
from conftest import setup_model

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)

PTB_VOCAB, WT2_VOCAB = 10_000, 33_278


def lamb_count(vocab, n, e, rounds, rank, components, layers=2):
    """The parameters of the model as lamb counts them: table V x e and softmax bias; per layer the LSTM (one bias
    vector) and every round's map (rank-k factors or a full matrix, with a bias); the output projection or the
    mixture (tanh projection with a bias, bias-free prior)."""
    total = vocab * e + vocab
    for layer in range(layers):
        m = e if layer == 0 else n
        total += 4 * n * (m + n) + 4 * n
        for i in range(1, rounds + 1):
            out = m if i % 2 else n  # odd rounds gate x (n -> m), even rounds gate h (m -> n)
            total += (rank * (m + n) if rank else m * n) + out
    if components == 1:
        total += 0 if n == e else n * e
    else:
        total += components * e * n + components * e + components * n
    return total


@pytest.fixture(scope="module")
def dictionary_dirs(tmp_path_factory):
    """Data directories holding only a dict.txt of 10,000 / 33,278 symbols (fairseq adds its 4 special ones)."""
    dirs = {}
    for vocab in (PTB_VOCAB, WT2_VOCAB):
        directory = tmp_path_factory.mktemp(f"dict{vocab}")
        (directory / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(vocab - 4)))
        dirs[vocab] = directory
    return dirs


# arch -> (vocabulary, budget, hidden n, embedding e, rounds, rank, mixture components, embedding ratio or None)
BUDGETS = {
    "mogrifier_lstm_lm_ptb": (PTB_VOCAB, 24_000_000, 912, 912, 5, 84, 1, None),
    "mogrifier_lstm_lm_baseline_ptb": (PTB_VOCAB, 24_000_000, 951, 951, 0, 0, 1, None),
    "mogrifier_lstm_lm_wt2": (WT2_VOCAB, 35_000_000, 1366, 272, 6, 48, 2, 0.1993194960596213),
    "mogrifier_lstm_lm_baseline_wt2": (WT2_VOCAB, 35_000_000, 1211, 428, 0, 0, 2, 0.3530770457779424),
}
TUNED_DROPOUTS = {  # input, inter-layer, state, output: lamb's best trials
    "mogrifier_lstm_lm_ptb": (0.729, 0.291, 0.387, 0.716),
    "mogrifier_lstm_lm_baseline_ptb": (0.628, 0.307, 0.369, 0.690),
    "mogrifier_lstm_lm_wt2": (0.547, 0.199, 0.221, 0.348),
    "mogrifier_lstm_lm_baseline_wt2": (0.609, 0.091, 0.271, 0.348),
}


@pytest.mark.parametrize("arch", list(BUDGETS))
def test_parameter_budget_is_filled_by_the_largest_hidden_size(dictionary_dirs, arch):
    vocab, budget, n, e, rounds, rank, components, ratio = BUDGETS[arch]
    with torch.device("meta"):  # counts only: no memory, no initialisation
        _, task, model = setup_model(dictionary_dirs[vocab], arch)
        assert len(task.target_dictionary) == vocab
        total = sum(p.numel() for p in model.parameters())
        assert total == lamb_count(vocab, n, e, rounds, rank, components)
        assert 0.99 * budget <= total <= budget
        bigger_e = e if ratio is None else round(ratio * (n + 1))
        _, _, bigger = setup_model(
            dictionary_dirs[vocab],
            arch,
            "--mogrifier-hidden-size",
            str(n + 1),
            "--mogrifier-embed-dim",
            str(bigger_e if ratio else n + 1),
        )
        assert sum(p.numel() for p in bigger.parameters()) > budget  # n is the largest hidden size that fits
    decoder = model.decoder
    lstm = decoder.lstm
    assert (lstm.num_layers, lstm.hidden_size, lstm.input_size, lstm.rounds, lstm.rank) == (2, n, e, rounds, rank)
    assert lstm.sum_layer_outputs and lstm.cap_input_gate and lstm.layers[0].forget_bias == 1.0
    assert (lstm.input_dropout, lstm.inter_layer_dropout, lstm.state_dropout, lstm.output_dropout) == TUNED_DROPOUTS[
        arch
    ]
    # lamb's configs: shared_mask_dropout False; the state mask per window (static_rnn, PTB) or per step
    # (dynamic_rnn, WikiText-2)
    assert not lstm.shared_mask_dropout and lstm.state_dropout_per_step == (vocab == WT2_VOCAB)
    head = decoder.output_projection
    assert not head.shared_mask
    assert head.components == components and head.weight is decoder.embed_tokens.weight
    assert head.dropout == TUNED_DROPOUTS[arch][3]  # lamb: the projected output's dropout is the output dropout
    assert (head.projection is None) == (components == 1 and n == e)
    assert decoder.drop_state_probability == 0.01 and decoder.softmax_temperature == 1.0
    print(f"{arch}: n={n}, e={e}, {total:,} parameters ({total / budget:.2%} of the budget)")
