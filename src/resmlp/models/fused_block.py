"""Fused training step of the paper's ResMLP block: the Affines, LayerScales and residuals folded away.

The plain block (`ResMLPBlock.forward`) makes a full pass over the (B, N, C) tokens for every Affine,
LayerScale, bias and residual add, and as many again for their gradients. In the paper's block all of
these are per-channel (or per-token) affine maps next to a linear layer, so they fold into it, in
training too, by exact algebra on the small parameter tensors:

    cross-patch:  x + g1*(A(a1*x + b1) + b)        = x + s*(A x) + c,   s = g1*a1,
                                                                        c = g1*(b1 * rowsum(A) + b)
    channel MLP:  z + g2*(W2 GELU(W1(a2*z + b2') + b1) + bias2)
                                                   = z + W2f GELU(W1f z + b1f) + b2f,
                                                     W1f = W1*a2, b1f = b1 + W1 b2', W2f = g2*W2, b2f = g2*bias2

(a: Affine alpha, b: Affine beta, g: LayerScale gamma). Without stochastic depth, b2f is carried in the
cross-patch offset c (so the tokens leave the cross-patch step as z + b2f) and taken back out of fc1's
bias, which lets fc2's GEMM add the residual itself (addmm's input): the channel step then has no
elementwise pass but GELU.

`FusedBlockFunction` computes one block's forward and backward from the folded tensors with the fewest
full passes over memory: forward = one GEMM-epilogue pass for the cross-patch (x + c + s*(A x)) and GELU;
backward = GELU's gradient and the reductions the gradients of s, c and fc1's bias need. The folding
itself is ordinary autograd on the small tensors, so every original parameter gets its exact gradient.
The fused path computes what the plain block computes (tests/test_fused_train.py compares outputs and
gradients of every parameter); blocks of other designs (LayerNorm, MLP or convolutional cross-patch,
dropout, activations other than GELU) keep the plain path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from resmlp.layers import Affine, CrossPatchLinear, LayerScale


def fusable(block: nn.Module) -> bool:
    """Whether `block` (a ResMLPBlock) has the design the fused training step implements."""
    mlp = getattr(block, "channel_mlp", None)
    return (
        isinstance(getattr(block, "cross_patch", None), CrossPatchLinear)
        and isinstance(getattr(block, "cross_patch_norm", None), Affine)
        and isinstance(getattr(block, "channel_norm", None), Affine)
        and mlp is not None
        and isinstance(mlp.act, nn.GELU)
        and isinstance(mlp.fc1, nn.Linear) and mlp.fc1.bias is not None
        and isinstance(mlp.fc2, nn.Linear) and mlp.fc2.bias is not None
        and isinstance(mlp.norm, nn.Identity)
        and all(isinstance(d, nn.Dropout) and d.p == 0.0 for d in (mlp.drop1, mlp.drop2))
    )


def _gamma(scale: nn.Module) -> torch.Tensor | None:
    return scale.gamma if isinstance(scale, LayerScale) else None


def _drop_path_mask(batch: int, drop_prob: float, like: torch.Tensor) -> torch.Tensor:
    # the same draw as timm's DropPath (one Bernoulli per sample, scaled by 1/keep), so with the same RNG
    # state the fused and the plain step drop the same samples
    keep = 1.0 - drop_prob
    mask = like.new_empty((batch, 1, 1)).bernoulli_(keep)
    return mask.div_(keep) if keep > 0.0 else mask


def fused_block_forward(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The training forward of a fusable ResMLPBlock; equal to `block.forward(x)` (see module docstring)."""
    cp, norm1, norm2, mlp = block.cross_patch, block.cross_patch_norm, block.channel_norm, block.channel_mlp
    gamma1, gamma2 = _gamma(block.cross_patch_scale), _gamma(block.channel_scale)
    weight_a = cp.weight
    s = norm1.alpha if gamma1 is None else gamma1 * norm1.alpha
    c = norm1.beta * weight_a.sum(1, keepdim=True) + cp.bias.unsqueeze(-1)  # (N, C)
    if gamma1 is not None:
        c = c * gamma1
    w1 = mlp.fc1.weight * norm2.alpha
    b1 = torch.addmv(mlp.fc1.bias, mlp.fc1.weight, norm2.beta)
    w2 = mlp.fc2.weight if gamma2 is None else mlp.fc2.weight * gamma2.unsqueeze(-1)
    b2 = mlp.fc2.bias if gamma2 is None else mlp.fc2.bias * gamma2

    drop_prob = getattr(block.drop_path, "drop_prob", 0.0) if block.training else 0.0
    if drop_prob > 0.0:
        m1 = _drop_path_mask(x.shape[0], drop_prob, c)
        m2 = _drop_path_mask(x.shape[0], drop_prob, c)
        s, c = s * m1, c * m1  # (B, 1, C), (B, N, C)
    else:
        m2 = None
        c = c + b2  # carry fc2's bias in the tokens; fc1 takes it back out of its bias
        b1 = b1 - torch.mv(w1, b2)
    folded = (x, weight_a, s, c, w1, b1, w2, b2 if m2 is not None else None, m2, mlp.act.approximate)
    if torch.compiler.is_compiling():  # inductor fuses the elementwise work itself, given the folded graph
        return folded_forward(*folded)
    return FusedBlockFunction.apply(*folded)


def folded_forward(x, a, s, c, w1, b1, w2, b2, m2, approximate: str) -> torch.Tensor:
    """FusedBlockFunction's arithmetic in plain differentiable ops (what torch.compile traces)."""
    z = x + c + s * torch.matmul(a, x)
    h = F.gelu(F.linear(z, w1, b1), approximate=approximate)
    return z + F.linear(h, w2) if m2 is None else z + m2 * F.linear(h, w2, b2)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _reduce_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return grad.sum_to_size(like.shape).to(like.dtype)


class FusedBlockFunction(torch.autograd.Function):
    """One ResMLP block from folded tensors; GEMMs run in the autocast dtype, the residual stream stays
    in the input's dtype (as in the plain block under autocast).

    x (B, N, C); a (N, N); s (C,) or (B, 1, C); c (N, C) or (B, N, C); w1 (H, C); b1 (H,); w2 (C, H);
    b2 (C,) and m2 (B, 1, 1) only with stochastic depth (else fc2's bias is in c and b1).
    """

    @staticmethod
    def forward(ctx, x, a, s, c, w1, b1, w2, b2, m2, approximate):  # noqa: D102 (documented above)
        dtype = _compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            batch, tokens, dim = x.shape
            x = x.contiguous()  # the stem's tokens are a transposed view; the GEMMs want rows
            x_c, a_c, w2_c = (t.to(dtype) for t in (x, a, w2))
            u = torch.bmm(a_c.expand(batch, tokens, tokens), x_c)  # the cross-patch product A x, (B, N, C)
            # fc1's input gets a column of ones and its weight fc1's bias, so the GEMM adds the bias (a
            # broadcast bias costs addmm a full write of its (B*N, H) output)
            z_ones = x.new_empty((batch * tokens, dim + 1), dtype=dtype)
            z_ones[:, dim] = 1
            w1_bias = torch.cat([w1.to(dtype), b1.to(dtype).unsqueeze(-1)], dim=1)
            residual_dtype = torch.promote_types(x.dtype, c.dtype)
            if residual_dtype == dtype:  # the tokens after the cross-patch residual, written in place
                z = z_ones[:, :dim]
                torch.addcmul(x + c, s, u, out=z.view(batch, tokens, dim))
            else:  # mixed precision: the residual stream stays in its dtype, fc1 reads a cast copy
                z = torch.addcmul(x + c, s, u).view(-1, dim)
                z_ones[:, :dim].copy_(z)
            pre = torch.mm(z_ones, w1_bias.t())
            h = F.gelu(pre, approximate=approximate)
            if m2 is not None:  # stochastic depth scales the channel branch per sample
                y = torch.addmm(b2.to(dtype), h, w2_c.t()).view(batch, tokens, dim)
                out = torch.addcmul(z.view(batch, tokens, dim), m2, y)
            elif residual_dtype == dtype:
                out = torch.addmm(z, h, w2_c.t()).view(batch, tokens, dim)  # residual in the GEMM
            else:  # the bf16 product joins the fp32 residual stream in one pass
                out = torch.add(z, torch.mm(h, w2_c.t())).view(batch, tokens, dim)
        ctx.save_for_backward(x_c, a_c, s, c, u, z_ones, w1_bias, pre, h, w2_c, m2)
        ctx.approximate, ctx.dtype, ctx.grad_dtype = approximate, dtype, out.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        x_c, a_c, s, c, u, z_ones, w1_bias, pre, h, w2_c, m2 = ctx.saved_tensors
        need = ctx.needs_input_grad
        dtype = ctx.dtype
        with torch.autocast(grad_out.device.type, enabled=False):
            batch, tokens, dim = grad_out.shape
            grad_out = grad_out.to(ctx.grad_dtype)
            grad_y = grad_out if m2 is None else grad_out * m2
            grad_y = grad_y.reshape(-1, dim)
            grad_b2 = grad_y.sum(0) if m2 is not None and need[7] else None
            grad_y_c = grad_y.to(dtype)
            grad_w2 = grad_y_c.t().mm(h) if need[6] else None
            grad_pre = torch.ops.aten.gelu_backward(grad_y_c.mm(w2_c), pre, approximate=ctx.approximate)
            # fc1's weight gradient from the tokens' columns alone (a view; an output 385 wide instead of 384 made
            # this fp32 GEMM 35 % slower on AVX-512), its bias's as a column sum: one cheap pass
            grad_w1 = grad_pre.t().mm(z_ones[:, :dim]) if need[4] else None
            grad_b1 = grad_pre.sum(0) if need[5] else None
            w1_c = w1_bias[:, :dim]
            grad_z = grad_out.reshape(-1, dim)
            if grad_z.dtype == dtype:  # fc1's input gradient accumulated in the GEMM
                grad_z = torch.addmm(grad_z, grad_pre, w1_c)
            else:
                grad_z = torch.add(grad_z, grad_pre.mm(w1_c))
            grad_z = grad_z.view(batch, tokens, dim)
            grad_c = _reduce_to(grad_z, c) if need[3] else None
            grad_s = _reduce_to(grad_z * u, s) if need[2] else None
            grad_u = torch.mul(grad_z, s).to(dtype)
            grad_a = torch.bmm(grad_u, x_c.transpose(1, 2)).sum(0) if need[1] else None
            grad_x = None
            if need[0]:
                a_t = a_c.t().expand(batch, tokens, tokens)
                if grad_z.dtype == dtype:  # the residual's gradient accumulated in the GEMM
                    grad_x = torch.baddbmm(grad_z, a_t, grad_u)
                else:
                    grad_x = torch.add(grad_z, torch.bmm(a_t, grad_u))
        return grad_x, grad_a, grad_s, grad_c, grad_w1, grad_b1, grad_w2, grad_b2, None, None


def set_fused_training(model: nn.Module, enabled: bool) -> nn.Module:
    """Switch the fused training step on or off in every ResMLP block of `model` (on by default)."""
    for module in model.modules():
        if hasattr(module, "fused_train"):
            module.fused_train = enabled
    return model
