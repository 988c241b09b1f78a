"""Compiled kernels for the steps that PyTorch's eager ops leave overhead-bound."""
