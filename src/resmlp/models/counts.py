"""Parameters and multiply-accumulates of a ResMLPConfig, counted from the sizes alone (no torch, no model).

The formulas follow resmlp.models.resmlp layer by layer; tests/test_model_counts.py checks them against the
measured counts (resmlp.complexity: the built model's parameters and torch's FlopCounterMode on the meta device)
for every preset, every Table 3 row and each choice of cross-patch, norm and pooling. MACs are those
FlopCounterMode counts: matrix products and convolutions (biases, norms, activations and LayerScale are not
multiply-accumulates of a matrix and are left out, as in the paper's FLOPs).
"""

from __future__ import annotations

from resmlp.models.config import ResMLPConfig


def _norm_params(kind: str, dim: int) -> int:
    """affine, layernorm, batchnorm and l2 (an affine after the scaling) each learn a scale and a shift."""
    return 0 if kind == "none" else 2 * dim


def _cross_patch(cfg: ResMLPConfig) -> tuple[int, int]:
    """(parameters, MACs) of one block's cross-patch sublayer, its norm and LayerScale included."""
    n, dim = cfg.num_patches, cfg.dim
    if cfg.cross_patch == "none":
        return 0, 0
    if cfg.cross_patch == "linear":  # A (N x N) and its bias, applied to each of dim channels
        params, macs = n * n + n, n * n * dim
    elif cfg.cross_patch == "mlp":
        hidden = cfg.cross_patch_hidden or 4 * n
        params, macs = 2 * n * hidden + hidden + n, 2 * n * hidden * dim
    else:  # 3x3 convolutions on the grid: full, depth-wise, or depth-wise then point-wise
        per_output = dim if cfg.cross_patch == "conv3x3" else 1
        params, macs = dim * per_output * 9 + dim, n * dim * per_output * 9
        if cfg.cross_patch == "dwsep3x3":
            params, macs = params + dim * dim + dim, macs + n * dim * dim
    return params + _norm_params(cfg.norm, dim) + (dim if cfg.layerscale else 0), macs


def _channel_mlp(dim: int, hidden: int) -> tuple[int, int]:
    """(parameters, MACs per token) of fc1 dim -> hidden and fc2 hidden -> dim, with biases."""
    return 2 * dim * hidden + hidden + dim, 2 * dim * hidden


def params_and_macs(cfg: ResMLPConfig) -> tuple[int, int]:
    """(parameters, multiply-accumulates of one image's forward pass) of the network `cfg` describes."""
    n, dim = cfg.num_patches, cfg.dim
    hidden = int(dim * cfg.mlp_ratio)
    stem_params = cfg.in_chans * cfg.patch_size**2 * dim + dim
    params, macs = stem_params, n * dim * cfg.in_chans * cfg.patch_size**2
    params += n * dim if cfg.pos_embed else 0
    cross_params, cross_macs = _cross_patch(cfg)
    mlp_params, mlp_macs = _channel_mlp(dim, hidden)
    block_params = cross_params + _norm_params(cfg.norm, dim) + mlp_params + (dim if cfg.layerscale else 0)
    params += cfg.depth * block_params + _norm_params(cfg.norm, dim)
    macs += cfg.depth * (cross_macs + n * mlp_macs)
    if cfg.pooling == "class_mlp":  # a class token and two layers: aggregation over N+1 tokens, a channel MLP
        layer_params = 2 * dim + (n + 1) + 1 + dim + 2 * dim + mlp_params + dim  # Affine, linear, scales always on
        params += dim + 2 * layer_params
        macs += 2 * ((n + 1) * dim + mlp_macs)
    if cfg.num_classes > 0:
        params += dim * cfg.num_classes + cfg.num_classes
        macs += dim * cfg.num_classes
    return params, macs
