"""``mogrifier_lstm_lm`` runs its BPTT windows on a GPU as CUDA graphs unless ``--mogrifier-no-cuda-graphs``
(the graphs themselves: tests/modules/test_mogrifier_graphs.py)."""

from test_lstm_lm import parsed_model
from test_mogrifier_lstm_lm import TINY

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)


def test_cuda_graphs_are_the_default_and_the_flag_turns_them_off(lm_data):
    for flags, on in (([], True), (["--mogrifier-no-cuda-graphs"], False)):
        _, _, model = parsed_model(lm_data, "mogrifier_lstm_lm_ptb", *TINY["mogrifier_lstm_lm_ptb"], *flags)
        assert model.decoder.lstm.cuda_graphs is on
