"""Transformer-XL (Dai et al., 2019): relative multi-head attention, the layers and stack with memory, the projected
adaptive softmax."""
