"""The Mogrifier LSTM (Melis et al., 2020): the layer and stack, the fused recurrence (CPU threads, Triton kernels, CUDA
graphs)."""
