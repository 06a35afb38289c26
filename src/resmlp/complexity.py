"""Model size and compute: parameters and multiply-accumulates (the paper's "FLOPs")."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from resmlp.models.resmlp import ResMLP, ResMLPConfig


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_gmacs(model: torch.nn.Module, input_shape: tuple[int, ...]) -> float:
    """Multiply-accumulates (x1e9) of one forward pass on an input of `input_shape`, batch 1.

    Uses torch's FlopCounterMode (matrix products and convolutions); it counts 2 FLOPs per MAC.
    """
    device = next(model.parameters()).device
    x = torch.zeros(1, *input_shape, device=device)
    # FlopCounterMode's module tracker trips over parameters that require grad under no_grad
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.requires_grad_(False)
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model.eval()(x)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    return counter.get_total_flops() / 2 / 1e9


def complexity(config: ResMLPConfig) -> tuple[int, float]:
    """(parameters, GMACs) of a configuration, computed on the meta device: instant, no memory."""
    with torch.device("meta"):
        model = ResMLP(config)
    # outside the device context: its per-op dispatch hook would slow the forward pass tenfold
    return count_params(model), count_gmacs(model, (config.in_chans, config.img_size, config.img_size))


def training_memory_bytes(config: ResMLPConfig, batch_size: int) -> int:
    """A lower estimate, from the sizes alone (nothing is built), of the memory a training step of `config`
    takes at `batch_size`: fp32 weights, gradients and one optimizer moment (LAMB and AdamW keep two), and the
    activations the backward pass keeps, counted at 2 bytes (bf16) and only the largest ones. No allocator
    slack, data or workspace: refusing a config for exceeding the machine's memory is never wrong."""
    tokens, dim = config.num_patches, config.dim
    hidden = int(dim * config.mlp_ratio)
    # the convolution ablations' weights are left out: small, and this stays a lower estimate
    cross = {"linear": tokens * tokens, "mlp": 2 * tokens * (config.cross_patch_hidden or 4 * tokens)}.get(
        config.cross_patch, 0)
    per_block = cross + 2 * dim * hidden + 8 * dim
    params = (config.depth * per_block + config.in_chans * config.patch_size**2 * dim
              + dim * max(config.num_classes, 0))
    # kept per block, at least: the two sublayers' inputs (2 x tokens x dim) and the MLP's hidden layer
    # (tokens x hidden)
    activations = batch_size * config.depth * tokens * (2 * dim + hidden)
    return 4 * 3 * params + 2 * activations



# Above this many classes an evaluation sums per-class image and hit counts instead of the full confusion matrix
# (resmlp.evaluation.classify; bounded by the cells allocated, 2**22, not by the class list's bound): ImageNet-21k's
# 21,841 classes would make a 477 M-cell matrix, 27 GB with its copies
CONFUSION_MAX_CLASSES = 2048


def evaluation_memory_bytes(num_classes: int) -> int:
    """The counts an evaluation sums (resmlp.evaluation.classify; the confusion matrix, or two per-class vectors
    above CONFUSION_MAX_CLASSES): int64 on the device, a float64 copy packed for the all-reduce, its host read as
    a Python list (about 32 bytes a value) and the int64 array."""
    cells = num_classes**2 if num_classes <= CONFUSION_MAX_CLASSES else 2 * num_classes
    return cells * (8 + 8 + 32 + 8)


def dino_memory_bytes(dim: int, out_dim: int, hidden_dim: int, bottleneck_dim: int, crops: int, crop_size: int,
                      batch_size: int) -> int:
    """A lower estimate of what DINO adds to a training step (resmlp.train.dino), in fp32: the head's weights in
    the student and the teacher, the student's gradients and two optimizer moments, and the weight-normalised
    last layer's weight and its gradient (7 copies); per crop and image, the student's outputs, their
    log-softmax and both gradients, the teacher's outputs and softmax (6 copies); the crops as images."""
    head = dim * hidden_dim + hidden_dim * hidden_dim + hidden_dim * bottleneck_dim + bottleneck_dim * out_dim
    outputs = 6 * batch_size * crops * out_dim
    images = batch_size * crops * 3 * crop_size**2
    return 4 * (7 * head + outputs + images)
