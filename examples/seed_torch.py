"""PyTorch functions of the ops of seed.grad, written by gradc compile --emit torch.

Each is gradc.adapters.torch.as_torch(op) (docs/frameworks.md). Needs gradc and torch;
the kernels are compiled into gradc's cache on first import. Do not edit: recompile.
"""
import warnings
from pathlib import Path

import gradc
from gradc.adapters.torch import as_torch

SOURCE = Path(__file__).resolve().parent / 'seed.grad'
with warnings.catch_warnings():     # gradc compile printed them
    warnings.simplefilter("ignore", gradc.GradcWarning)
    MODULE = gradc.load(SOURCE)
OPS = {name: as_torch(op) for name, op in MODULE.OPS.items()}

clipped_relu = OPS['clipped_relu']
critic = OPS['critic']
custom_linear = OPS['custom_linear']
gradient_penalty = OPS['gradient_penalty']
mlp = OPS['mlp']
scaled_tanh = OPS['scaled_tanh']
sign_ste = OPS['sign_ste']
softmax_xent = OPS['softmax_xent']

__all__ = ['OPS', 'clipped_relu', 'critic', 'custom_linear', 'gradient_penalty', 'mlp', 'scaled_tanh', 'sign_ste', 'softmax_xent']
