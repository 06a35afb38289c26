"""Fast inference: a folded, token-major ResMLP in fp32, bf16 or int8, image preprocessing and predict().

`optimize(model, precision)` starts from `resmlp.fuse(model)` (every Affine folded into a linear layer)
and, for the paper's architecture (linear cross-patch, Affine norms, average pooling), lays the tokens
out patch-major as (N, B, C). Then the cross-patch product A @ X is one plain matrix product
(N, N) @ (N, B*C) for the whole batch, with no transposes and no broadcast batched products, and the
channel MLP works on the same buffer seen as (N*B, C). Each block updates that buffer in place and
reuses two scratch buffers, so a batch allocates its large activations once instead of once per
layer (fresh allocations of that size cost page faults on every forward). Other architectures
(Mixer, convolutions, class-MLP pooling) and int8 run their fused model unchanged.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resmlp.errors import CheckpointError
from resmlp.folding import FusedBlock, fuse
from resmlp.hostinfo import native_bf16
from resmlp.models.resmlp import ResMLP
from resmlp.preprocess import Preprocess, preprocess_of_file
from resmlp.runtime import compile_module, cuda_native_bf16

PRECISIONS = ("fp32", "bf16", "int8")
COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")  # torch.compile modes optimize() accepts


# ------------------------------------------------------------------------------------------ model
class TokenMajorBlock(nn.Module):
    """A folded ResMLP block on (N, B, C) tokens, computed in place in its input buffer.

    With the fused block's z = x + bias + scale * (A @ x) and y = z + fc2(act(fc1(z))), the fc2 bias b2
    moves into the cross-patch bias (z' = z + b2) and out of fc1 (b1' = b1 - W1 b2), so that
    y = z' + W2 act(W1 z' + b1'): no bias pass after either product, and the residual sum is the
    product's own accumulation (addmm_ into z').
    """

    def __init__(self, block: FusedBlock) -> None:
        super().__init__()
        cp, fc1, fc2 = block.cross_patch, block.fc1, block.fc2
        frozen = {"requires_grad": False}
        with torch.no_grad():
            self.weight = nn.Parameter(cp.weight.clone(), **frozen)  # A (N, N)
            self.scale = nn.Parameter(cp.scale.clone(), **frozen)  # (C,)
            self.bias = nn.Parameter((cp.bias + fc2.bias).unsqueeze(1).clone(), **frozen)  # (N, 1, C)
            self.fc1_weight = nn.Parameter(fc1.weight.clone(), **frozen)  # (hidden, C)
            self.fc1_bias = nn.Parameter(fc1.bias - fc1.weight @ fc2.bias, **frozen)
            self.fc2_weight = nn.Parameter(fc2.weight.clone(), **frozen)  # (C, hidden)
        self.act = block.act

    def forward(self, x: torch.Tensor, scaled: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """x (N, B, C) is overwritten with the output; `scaled` (N, B, C) and `hidden` (N*B, hidden) are
        scratch buffers reused by every block, so the large activations are allocated once per batch."""
        n, b, c = x.shape
        torch.mul(x, self.scale, out=scaled)  # scale * (A @ x) == A @ (scale * x): scale acts on columns
        x.add_(self.bias).view(n, b * c).addmm_(self.weight, scaled.view(n, b * c))
        tokens = x.view(n * b, c)
        torch.mm(tokens, self.fc1_weight.t(), out=hidden)
        _activate_(hidden.add_(self.fc1_bias), self.act)
        tokens.addmm_(hidden, self.fc2_weight.t())
        return x


def _activate_(x: torch.Tensor, act: nn.Module) -> None:
    # GELU has no in-place module form; the others keep their module (in place where it exists)
    if isinstance(act, nn.GELU):
        torch.ops.aten.gelu_(x, approximate=act.approximate)
    else:
        x.copy_(act(x))


class TokenMajorResMLP(nn.Module):
    """Inference-only ResMLP built from a fused one; takes float images (B, C, H, W), returns fp32 logits."""

    def __init__(self, fused: ResMLP) -> None:
        super().__init__()
        self.config = fused.config
        self.stem = fused.stem
        pos = fused.pos_embed
        self.pos_embed = None if pos is None else nn.Parameter(pos.detach()[0].unsqueeze(1), requires_grad=False)
        self.blocks = nn.ModuleList(TokenMajorBlock(b) for b in fused.blocks)
        self.head = fused.head

    def check_input(self, x: torch.Tensor) -> None:
        ResMLP.check_input(self, x)  # same checks and messages as the model (it reads config and stem only)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _cast_input(x, self.stem.proj.weight.dtype)
        self.check_input(x)
        # conv output (B, C, h, w) -> (N, B, C): the only layout change in the network
        x = self.stem.proj(x).flatten(2).permute(2, 0, 1).contiguous()
        if self.pos_embed is not None:
            x.add_(self.pos_embed)
        n, b, c = x.shape
        scaled = torch.empty_like(x)
        hidden = x.new_empty(n * b, self.blocks[0].fc1_weight.shape[0])
        for block in self.blocks:
            x = block(x, scaled, hidden)
        return self.head(x.mean(0)).float()


class CastingWrapper(nn.Module):
    """Runs a model in its own dtype on float images of any dtype and returns fp32 outputs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = getattr(model, "config", None)
        self.dtype = next(model.parameters()).dtype

    def _apply(self, fn, recurse=True):  # .to(dtype) changes the weights' dtype: follow it
        out = super()._apply(fn, recurse)
        self.dtype = next(self.model.parameters()).dtype
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(_cast_input(x, self.dtype)).float()


def _cast_input(x: Any, dtype: torch.dtype) -> Any:
    # non-float or non-tensor input is left for check_input to reject with its explanation
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _token_major_ok(fused: ResMLP) -> bool:
    stem_plain = isinstance(fused.stem.norm, nn.Identity) and fused.stem.flatten
    return (
        stem_plain
        and all(isinstance(b, FusedBlock) for b in fused.blocks)
        and isinstance(fused.norm, nn.Identity)  # the final Affine went into the head
        and fused.class_mlp is None
    )


def native_bf16_available(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 matrix products run on native hardware (AVX-512 BF16 / AMX on CPU, CUDA bf16)."""
    device = torch.device(device)
    if device.type == "cuda":
        return cuda_native_bf16(device)
    return native_bf16()


def optimize(model: nn.Module, precision: str = "fp32", compile: bool | str = False) -> nn.Module:
    """An inference copy of `model`: folded, token-major where possible, in `precision`.

    precision: "fp32" (equal to the model within float rounding), "bf16" (weights and activations in
    bfloat16; fast only where the hardware has bf16 matrix units) or "int8" (dynamic int8 quantisation
    of the channel-MLP and head linears, fbgemm/x86 on CPU). compile: False, True (= "default"), or a
    torch.compile mode of COMPILE_MODES (see `compile_for_inference`).
    The result takes float images of any dtype and returns float32 logits; it is for eval only.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    device = next(model.parameters()).device
    mode = compile_mode(compile, device)  # checked before the folding work
    if not isinstance(model, ResMLP):  # e.g. a timm convnet saved with resmlp.save: nothing to fold
        if precision != "fp32":
            raise ValueError(f"precision {precision} is for ResMLP/Mixer models; this checkpoint holds a "
                             f"{type(model).__name__}: use --precision fp32")
        warnings.warn(f"optimize: {type(model).__name__} is not a ResMLP/Mixer, so nothing was folded: it runs as "
                      f"it is, in fp32 and eval mode{', compiled (' + mode + ')' if mode else ''}", stacklevel=2)
        fast = CastingWrapper(model.float()).eval().requires_grad_(False)
        return compile_for_inference(fast, mode) if mode else fast
    fused = fuse(model).float()
    # int8 quantises nn.Linear modules, which the token-major blocks (raw in-place products) don't use
    token_major = _token_major_ok(fused) and precision != "int8"
    fast: nn.Module = TokenMajorResMLP(fused) if token_major else CastingWrapper(fused)
    fast = fast.eval().requires_grad_(False)
    if precision == "bf16":
        if not native_bf16_available(device):
            warnings.warn(
                f"this {device.type.upper()} has no native bf16 matrix units (no AVX-512 BF16 / AMX), so bf16 "
                "products are emulated and much slower than fp32; use precision='fp32' or 'int8' here",
                stacklevel=2,
            )
        fast = fast.to(torch.bfloat16)
    elif precision == "int8":
        if device.type != "cpu":
            raise ValueError("int8 dynamic quantisation runs on CPU only; move the model with model.cpu() or "
                             "use precision='bf16' on GPU")
        fast = _quantize_linears(fast)
    if mode:
        fast = compile_for_inference(fast, mode)
    return fast


def compile_mode(compile: bool | str | None, device: torch.device | str = "cpu") -> str | None:
    """`optimize`'s compile argument as a torch.compile mode of COMPILE_MODES, or None for no compilation."""
    if compile is None or compile is False:
        return None
    mode = "default" if compile is True else compile
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {compile!r}; choose one of {', '.join(COMPILE_MODES)}")
    if mode == "reduce-overhead" and torch.device(device).type != "cuda":
        raise ValueError(f"compile mode reduce-overhead replays CUDA graphs and needs a CUDA GPU; this model is "
                         f"on {torch.device(device).type}: move it to the GPU, or use the default or max-autotune")
    return mode


def compile_for_inference(module: nn.Module, mode: str = "default") -> nn.Module:
    """torch.compile(module) for evaluation, with static shapes: one graph per batch size, as CUDA graphs need
    anyway, instead of the slower shape-generic kernels torch switches to when a second batch size comes.

    mode "max-autotune" lets inductor time several kernels (GEMM templates included) per product and keep the
    fastest: slow to compile, for long-running serving. "reduce-overhead" (CUDA only) records the forward as a
    CUDA graph and replays it, removing the per-kernel launch cost; its outputs live in memory the next replay
    reuses, so the returned logits are copied out.
    """
    compiled = compile_module(module, mode=None if mode == "default" else mode, dynamic=False)
    return GraphReplay(compiled) if mode == "reduce-overhead" else compiled


class GraphReplay(nn.Module):
    """A CUDA-graph-compiled model whose outputs are the caller's: each call starts a new graph step and
    returns a copy, so a kept result is never overwritten by the next replay."""

    def __init__(self, compiled: nn.Module) -> None:
        super().__init__()
        self.compiled = compiled
        self.config = getattr(compiled, "config", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(x).clone()


def optimize_features(model: nn.Module, precision: str = "fp32") -> nn.Module:
    """An inference copy of `model` returning its pooled pre-logits features in fp32: the representation
    DINO's k-NN and a linear probe evaluate (= model.forward_head(model.forward_features(x), pre_logits=True)).

    A ResMLP/Mixer gets optimize()'s fast path with an identity matrix for head: the final Affine folds into
    it as into a classifier, so the token-major blocks still apply (measured effect on `resmlp eval-knn`:
    docs/distillation_dino_finetune.md). precision: "fp32", "bf16" or "fp16" (a GPU without native bf16:
    runtime.resolve_amp's rule); other models, and every model in fp16, run their own forward_head under
    autocast (fp16 weights could overflow where autocast keeps fp32). Puts `model` in eval mode.
    """
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"feature precision must be fp32, bf16 or fp16, got {precision!r}")
    model.eval()  # features are an evaluation (the non-ResMLP path runs `model` itself)
    if not isinstance(model, ResMLP) or precision == "fp16":
        if not hasattr(model, "forward_head"):  # torchvision's classifiers have no pre-logits API
            raise ValueError(f"frozen features come from ResMLP, Mixer and timm models (their pre-logits); this "
                             f"{type(model).__name__} has none: evaluate it with resmlp eval")
        return PreLogits(model, precision).eval().requires_grad_(False)
    width = model.num_features
    identity = nn.Linear(width, width).to(model.stem.proj.weight.device)
    with torch.no_grad():
        identity.weight.copy_(torch.eye(width))
        identity.bias.zero_()
    head, model.head = model.head, identity  # fuse() copies the model, head swap included
    try:
        return optimize(model, precision)
    finally:
        model.head = head


class PreLogits(nn.Module):
    """Any timm-style model's pooled pre-logits features, in fp32, computed in fp32 or under bf16 / fp16 autocast."""

    def __init__(self, model: nn.Module, precision: str = "fp32") -> None:
        super().__init__()
        self.model = model
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None):
            return self.model.forward_head(self.model.forward_features(x), pre_logits=True).float()


def _quantize_linears(model: nn.Module) -> nn.Module:
    from torch.ao.quantization import quantize_dynamic

    # torch.ao's eager dynamic quantisation is deprecated in favour of torchao, which is not a dependency
    # here; it still runs fbgemm's int8 kernels, so its warnings are noise for the user
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


# ------------------------------------------------------------------------------------------ predict
@torch.inference_mode()
def predict(model: nn.Module, images: torch.Tensor, top_k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k softmax probabilities and class indices, each (B, k), for a preprocessed batch.

    NaN or infinite logits (broken weights, an overflow in low precision) are an error, never a ranking.
    """
    logits = model(images).float()
    finite = torch.isfinite(logits).all(dim=-1)
    if bool((~finite).any()):  # the one read of a batch
        raise CheckpointError(f"the model gave NaN/infinite logits for {int((~finite).sum())} of {len(logits)} "
                              "image(s); its weights are broken or overflow in this precision: use float32 or "
                              "another checkpoint")
    probs = logits.softmax(-1)
    return probs.topk(min(top_k, probs.shape[-1]), dim=-1)


@dataclass
class LoadedModel:
    """A checkpoint ready for inference: the model (eval mode), its preprocessing, classes and dataset."""

    model: nn.Module
    preprocess: Preprocess
    class_names: list[str] | None  # None: the checkpoint doesn't name its classes
    dataset: str | None  # the dataset kind it was trained on, when its metadata says
    metadata: dict[str, Any]

    @property
    def num_classes(self) -> int:
        cfg = getattr(self.model, "config", None)
        if cfg is not None:
            return cfg.num_classes
        return int(getattr(self.model, "num_classes", 0))

    def names(self) -> list[str]:
        """Class names: the checkpoint's, ImageNet's for a published 1k / 21k head, else `class_<i>`."""
        from resmlp.models.pretrained import imagenet_class_names

        return (self.class_names or imagenet_class_names(self.num_classes)
                or [f"class_{i}" for i in range(self.num_classes)])


def load_for_inference(path: str | Path, dataset: str | None = None, crop_pct: float | None = None,
                       checkpoint_key: str | None = None) -> LoadedModel:
    """Read a checkpoint once: model, preprocessing (resmlp.preprocess.preprocess_of_file: the file's, a training
    state's run config, or assumed by the file's kind with `preprocess.note` saying so; `crop_pct` replaces the
    crop), class names and dataset kind. checkpoint_key: the entry of a training checkpoint to load."""
    from resmlp.checkpoint import load_with_header

    model, header = load_with_header(path, checkpoint_key=checkpoint_key)
    model.eval()
    metadata = dict(header.get("extra") or {})
    run_data = ((header.get("torch") or {}).get("run_config") or {}).get("data")
    if not metadata and isinstance(run_data, dict) and isinstance(run_data.get("kind"), str):
        metadata["dataset"] = run_data["kind"]  # a training state: the run's dataset
    pre = preprocess_of_file(header, model, dataset=dataset or metadata.get("dataset"), crop_pct=crop_pct)
    names = metadata.get("class_names")
    names = [str(n) for n in names] if isinstance(names, list) else None
    loaded = LoadedModel(model, pre, names, metadata.get("dataset"), metadata)
    if names is not None and len(names) != loaded.num_classes:
        loaded.class_names = None  # metadata that doesn't match the head is not trusted for names
    return loaded
