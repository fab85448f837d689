"""AWD-LSTM's regularised LSTM (Merity et al., 2018): locked dropout, weight drop, the stack."""
