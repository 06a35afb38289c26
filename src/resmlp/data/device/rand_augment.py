"""timm's RandAugment ('rand-m9-mstd0.5-inc1' and its kin) on whole batches, where the images are (CPU or GPU).

timm's RandAugment (timm.data.auto_augment) runs per PIL image in a loader worker: it picks `n` ops (with
replacement) from its list, applies each with probability `p` at a magnitude drawn from N(m, mstd) clipped to
[0, mmax or 10], and turns the magnitude into the op's argument with the op's level function (a random sign
for rotations, shears, translations and the 'increasing' enhancements). No library runs that policy on batches:
torchvision's and DALI's RandAugment use other ops and magnitude scales (docs/training.md), so this module is a
twin of timm's, checked op by op against timm's PIL functions and in distribution against timm's own draws
(tests/test_device_augment.py).

Two halves:
- `draw_rand_augment` draws each image's ops and arguments on the CPU from the image's own uniforms (its
  sampler key, resmlp.data.random_numbers), as timm's level functions do; a few numbers an image.
- `plan_rand_augment` and `run_step` apply them to a float batch of whole uint8 values (N, C, S, S) on its
  device as a fixed sequence of steps (every colour op, one warp for the geometric ops, per layer): the images
  that drew an op are gathered, transformed together and put back. The colour ops reproduce PIL's
  integer arithmetic (LUTs, truncating blends, the 'L' conversion's fixed-point weights), so they agree with PIL
  to within one level; the geometric ops map every output pixel through PIL's affine matrix and sample with
  torch's grid_sample (bicubic a=-0.75 where PIL's affine bicubic uses a=-1, hence a PSNR bound, not equality),
  filling what falls outside with timm's `img_mean` exactly as PIL does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

LEVEL_DENOM = 10.0  # timm's _LEVEL_DENOM: magnitudes are on a 0-10 scale
TRANSLATE_PCT = 0.45  # timm's default translate_pct for the *Rel translations
# timm's _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS, in timm's order (the op index is a position here)
OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color", "Contrast",
       "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
INCREASING_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                  "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                  "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
SIGNED = GEOMETRIC + ("ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing")
RESAMPLE = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}
L_WEIGHTS = (19595, 38470, 7471)  # PIL's RGB -> 'L' in 16-bit fixed point (Convert.c's L24), rounded by + 0x8000
TRUNCATION_SLACK = 1e-3
UNIFORMS_PER_LAYER = 6  # op, apply, two for the normal magnitude, sign, interpolation


@dataclass(frozen=True)
class RandAugmentSpec:
    """A parsed 'rand-...' string (timm's rand_augment_transform keys m, n, p, mstd, mmax, inc)."""

    magnitude: float = 10.0
    num_layers: int = 2
    prob: float = 0.5
    magnitude_std: float = 0.0  # inf: uniform in [0, magnitude] (timm: mstd > 100)
    magnitude_max: float | None = None
    increasing: bool = False

    @property
    def ops(self) -> tuple[str, ...]:
        return INCREASING_OPS if self.increasing else OPS


def parse_rand_augment(config: str) -> RandAugmentSpec:
    """timm's 'rand-...' grammar; ValueError naming what is not supported (weighted 't' sets, AutoAugment
    policies, AugMix: the timm pipeline, data.pipeline=timm, runs those)."""
    hint = "; set data.pipeline=timm to run it with timm's per-image transform"
    if not config.startswith("rand"):
        raise ValueError(f"the device pipeline runs timm's RandAugment ('rand-...'), not {config!r}{hint}")
    fields: dict[str, float | bool] = {}
    for part in config.split("-")[1:]:
        if part.startswith("t"):
            raise ValueError(f"RandAugment transform set {part!r} in {config!r} (weighted or 3-Augment choices) "
                             f"is not in the device pipeline{hint}")
        key, value = (re.split(r"(\d.*)", part) + [""])[:2]
        if not value:
            continue  # timm ignores a section without a number
        number = float(value)
        if key == "mstd":
            fields["magnitude_std"] = math.inf if number > 100 else number
        elif key in ("m", "n", "p", "mmax", "inc"):
            fields[{"m": "magnitude", "n": "num_layers", "p": "prob", "mmax": "magnitude_max",
                    "inc": "increasing"}[key]] = bool(int(number)) if key == "inc" else number
        else:
            raise ValueError(f"unknown RandAugment section {part!r} in {config!r} (timm knows m, n, p, mstd, mmax, "
                             "inc and t)")
    fields["num_layers"] = int(fields.get("num_layers", 2))
    return RandAugmentSpec(**fields)


def magnitude_to_arg(name: str, magnitude: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """timm's level function of op `name` (LEVEL_TO_ARG) on arrays of magnitudes and sign draws."""
    level = magnitude / LEVEL_DENOM
    sign = np.where(negative, -1.0, 1.0)
    if name == "Rotate":
        return sign * level * 30.0
    if name in ("ShearX", "ShearY"):
        return sign * level * 0.3
    if name in ("TranslateXRel", "TranslateYRel"):
        return sign * level * TRANSLATE_PCT
    if name == "Posterize":
        return np.trunc(level * 4)
    if name == "PosterizeIncreasing":
        return 4 - np.trunc(level * 4)
    if name == "Solarize":
        return np.minimum(256, np.trunc(level * 256))
    if name == "SolarizeIncreasing":
        return 256 - np.minimum(256, np.trunc(level * 256))
    if name == "SolarizeAdd":
        return np.minimum(128, np.trunc(level * 110))
    if name.endswith("Increasing"):  # the enhancements: 1 +- 0.9 level, at least 0.1
        return np.maximum(0.1, 1.0 + sign * level * 0.9)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return level * 1.8 + 0.1
    return np.zeros_like(magnitude)  # AutoContrast, Equalize, Invert take no argument


@dataclass
class RandAugmentDraw:
    """Per layer, per image: op index into spec.ops (-1: skipped), argument, interpolation index."""

    op: np.ndarray  # (layers, N) int
    arg: np.ndarray  # (layers, N) float
    resample: np.ndarray  # (layers, N) int into the resample choices


def draw_rand_augment(spec: RandAugmentSpec, u: np.ndarray, n_resample: int = 1) -> RandAugmentDraw:
    """Each image's ops from its uniforms u (N, layers * UNIFORMS_PER_LAYER), as timm draws them: a uniform op
    choice with replacement, applied when u <= p (timm skips when random() > p), magnitude N(m, mstd) (or
    uniform in [0, m] for mstd inf) clipped to [0, mmax or 10], negated when u > 0.5, and one of `n_resample`
    interpolations for the geometric ops."""
    ops, args, resamples = [], [], []
    for layer in range(spec.num_layers):
        v = u[:, layer * UNIFORMS_PER_LAYER:(layer + 1) * UNIFORMS_PER_LAYER]
        op = np.minimum((v[:, 0] * len(spec.ops)).astype(np.int64), len(spec.ops) - 1)
        magnitude = np.full(len(u), float(spec.magnitude))
        if spec.magnitude_std == math.inf:
            magnitude = v[:, 2] * spec.magnitude
        elif spec.magnitude_std > 0:  # Box-Muller from two uniforms
            normal = np.sqrt(-2 * np.log1p(-v[:, 2])) * np.cos(2 * math.pi * v[:, 3])
            magnitude = magnitude + spec.magnitude_std * normal
        magnitude = np.clip(magnitude, 0.0, spec.magnitude_max or LEVEL_DENOM)
        arg = np.zeros(len(u))
        for index, name in enumerate(spec.ops):
            chosen = op == index
            arg[chosen] = magnitude_to_arg(name, magnitude[chosen], v[chosen, 4] > 0.5)
        ops.append(np.where(v[:, 1] <= spec.prob, op, -1))
        args.append(arg)
        resamples.append(np.minimum((v[:, 5] * n_resample).astype(np.int64), n_resample - 1))
    shape = (spec.num_layers, len(u))
    return RandAugmentDraw(np.array(ops, np.int64).reshape(shape), np.array(args, np.float64).reshape(shape),
                           np.array(resamples, np.int64).reshape(shape))


AFFINE = "Affine"  # the step that runs a layer's geometric ops (rotations, shears, translations) as one warp


@dataclass
class OpStep:
    """One op on the images `index` of a batch (maybe none), with their arguments (a colour op) or affine
    matrices (AFFINE: each image's own geometric op)."""

    name: str
    mode: str  # grid_sample mode of the AFFINE step
    index: np.ndarray
    values: np.ndarray  # (n,) arguments, or (n, 2, 3) matrices


def plan_rand_augment(spec: RandAugmentSpec, draw: RandAugmentDraw, size: tuple[int, int],
                      resample: tuple[str, ...]) -> list[OpStep]:
    """The drawn ops as a fixed sequence of steps, layer by layer: every colour op of the policy, then one
    AFFINE step per interpolation, each over the images that drew it (none: a step on an empty batch). The
    same steps whatever the batch drew, so the ops a batch dispatches do not grow with its size; within a
    layer an image takes one op, so grouping the geometric ops into one warp changes nothing."""
    steps = []
    geometric_ops = [i for i, name in enumerate(spec.ops) if name in GEOMETRIC]
    for layer in range(len(draw.op)):
        for index, name in enumerate(spec.ops):
            if name not in GEOMETRIC:
                chosen = np.nonzero(draw.op[layer] == index)[0]
                steps.append(OpStep(name, "", chosen, draw.arg[layer, chosen]))
        geometric = np.isin(draw.op[layer], geometric_ops)
        for r, mode in enumerate(resample):
            chosen = np.nonzero(geometric & (draw.resample[layer] == r))[0]
            matrices = np.zeros((len(chosen), 2, 3))
            for index in geometric_ops:
                mine = draw.op[layer, chosen] == index
                if mine.any():
                    matrices[mine] = grid_theta(affine_matrix(spec.ops[index], draw.arg[layer, chosen[mine]], size),
                                                size)
            steps.append(OpStep(AFFINE, RESAMPLE[mode], chosen, matrices))
    return steps


def run_step(x: torch.Tensor, step: OpStep, index: torch.Tensor, values: torch.Tensor,
             fill: torch.Tensor) -> None:
    """Apply `step` in place to the images `index` (on x's device) of the whole-valued batch x."""
    chosen = x.index_select(0, index)
    if step.name == AFFINE:
        out = warp(chosen, values.view(-1, 2, 3), fill, step.mode)
    else:
        out = COLOUR_OPS[step.name](chosen, values)
    x.index_copy_(0, index, out)


# ---------------------------------------------------------------------------------------------- the ops
def luminance(x: torch.Tensor) -> torch.Tensor:
    """PIL's convert('L') of whole-valued RGB floats (N, 3, H, W) -> (N, 1, H, W); a 1-channel image is itself."""
    if x.shape[1] == 1:
        return x
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return torch.floor((r * L_WEIGHTS[0] + g * L_WEIGHTS[1] + b * L_WEIGHTS[2] + 32768) / 65536)


def blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's Image.blend(degenerate, x, factor) on 8-bit images: computed in float32, truncated, clipped."""
    out = degenerate + factor.view(-1, 1, 1, 1).float() * (x - degenerate)
    return torch.floor(out.clamp(0, 255))  # PIL casts to UINT8 (truncates) after clipping at 0 and 255


def _lut(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Per image and channel look-up: table (N, C, 256) applied to whole values x (N, C, H, W)."""
    n, c, h, w = x.shape
    flat = x.reshape(n, c, h * w).long().clamp(0, 255)
    return table.to(x.dtype).gather(2, flat).view(n, c, h, w)


def _histogram(x: torch.Tensor) -> torch.Tensor:
    """(N, C, 256) pixel counts per image and channel."""
    n, c = x.shape[:2]
    flat = x.flatten(2).long().clamp(0, 255)
    return torch.zeros(n, c, 256, dtype=torch.int64, device=x.device).scatter_add_(2, flat, torch.ones_like(flat))


def auto_contrast(x: torch.Tensor, _arg: torch.Tensor) -> torch.Tensor:
    """ImageOps.autocontrast (cutoff 0), per channel: lo..hi stretched to 0..255 by PIL's LUT in doubles."""
    n, c = x.shape[:2]
    lo = x.flatten(2).amin(2).double()
    hi = x.flatten(2).amax(2).double()
    scale = 255.0 / (hi - lo).clamp(min=1)
    offset = -lo * scale
    levels = torch.arange(256, dtype=torch.float64, device=x.device)
    table = torch.trunc(levels * scale[..., None] + offset[..., None]).clamp(0, 255)
    table = torch.where((hi > lo)[..., None], table, levels)
    return _lut(x, table)


def equalize(x: torch.Tensor, _arg: torch.Tensor) -> torch.Tensor:
    """ImageOps.equalize per channel: PIL's LUT (step from the histogram without its last used bin)."""
    hist = _histogram(x)
    levels = torch.arange(256, device=x.device)
    last = torch.where(hist > 0, levels, -1).amax(2, keepdim=True)  # the highest value present
    step = (hist.sum(2, keepdim=True) - hist.gather(2, last.clamp(min=0))) // 255
    before = hist.cumsum(2) - hist  # pixels below each level
    table = ((step // 2 + before) // step.clamp(min=1)).clamp(max=255)
    identity = ((hist > 0).sum(2, keepdim=True) <= 1) | (step == 0)
    return _lut(x, torch.where(identity, levels, table))


def invert(x: torch.Tensor, _arg: torch.Tensor) -> torch.Tensor:
    return 255 - x


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Keep the top `bits` bits; 0 bits: black (timm's 'inc1' top magnitude, as resmlp.preprocess._posterize)."""
    step = torch.pow(2.0, 8 - bits.clamp(0, 8).float()).view(-1, 1, 1, 1)
    return torch.where(bits.view(-1, 1, 1, 1) <= 0, torch.zeros_like(x), torch.floor(x / step) * step)


def solarize(x: torch.Tensor, thresh: torch.Tensor) -> torch.Tensor:
    return torch.where(x < thresh.view(-1, 1, 1, 1), x, 255 - x)


def solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 128, (x + add.view(-1, 1, 1, 1)).clamp(max=255), x)


def color(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return blend(luminance(x).expand_as(x), x, factor)


def contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance.Contrast: blend with the grey of the rounded mean luminance."""
    mean = torch.floor(luminance(x).mean(dim=(1, 2, 3), keepdim=True, dtype=torch.float64) + 0.5)
    return blend(mean.to(x.dtype).expand_as(x), x, factor)


def brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return blend(torch.zeros_like(x), x, factor)


def sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance.Sharpness: blend with ImageFilter.SMOOTH (3x3, centre 5, scale 13, rounded), whose border
    pixels PIL leaves as they were."""
    c = x.shape[1]
    kernel = torch.ones(c, 1, 3, 3, dtype=x.dtype, device=x.device)
    kernel[:, :, 1, 1] = 5
    smooth = torch.floor(F.conv2d(x, kernel, groups=c) / 13 + 0.5).clamp(0, 255)
    degenerate = x.clone()
    degenerate[:, :, 1:-1, 1:-1] = smooth
    return blend(degenerate, x, factor)


COLOUR_OPS = {
    "AutoContrast": auto_contrast, "Equalize": equalize, "Invert": invert,
    "Posterize": posterize, "PosterizeIncreasing": posterize, "Solarize": solarize, "SolarizeIncreasing": solarize,
    "SolarizeAdd": solarize_add, "Color": color, "ColorIncreasing": color, "Contrast": contrast,
    "ContrastIncreasing": contrast, "Brightness": brightness, "BrightnessIncreasing": brightness,
    "Sharpness": sharpness, "SharpnessIncreasing": sharpness,
}


def affine_matrix(name: str, arg: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(N, 2, 3) PIL affine matrices (output pixel-edge coordinates -> input) of a geometric op, in doubles."""
    h, w = size
    m = np.zeros((len(arg), 2, 3))
    m[:, 0, 0] = m[:, 1, 1] = 1.0
    if name == "ShearX":
        m[:, 0, 1] = arg
    elif name == "ShearY":
        m[:, 1, 0] = arg
    elif name == "TranslateXRel":
        m[:, 0, 2] = arg * w
    elif name == "TranslateYRel":
        m[:, 1, 2] = arg * h
    elif name == "Rotate":  # Image.rotate about the centre (w/2, h/2), matrix rounded to 15 digits as PIL's
        angle = -np.radians(arg % 360.0)
        cos, sin = np.round(np.cos(angle), 15), np.round(np.sin(angle), 15)
        cx, cy = w / 2.0, h / 2.0
        m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = cos, sin, -sin, cos
        m[:, 0, 2] = cos * -cx + sin * -cy + cx
        m[:, 1, 2] = -sin * -cx + cos * -cy + cy
    else:
        raise ValueError(f"{name} is not a geometric op")
    return m


def grid_theta(matrix: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """PIL's affine matrices (N, 2, 3), pixel-edge coordinates, as F.affine_grid's theta: the same map in
    grid_sample's normalised coordinates (u = x / (w / 2) - 1), computed on the host in doubles."""
    h, w = size
    to_grid = np.array([[2 / w, 0, -1], [0, 2 / h, -1], [0, 0, 1]])
    from_grid = np.array([[w / 2, 0, w / 2], [0, h / 2, h / 2], [0, 0, 1]])
    square = np.concatenate([matrix, np.broadcast_to(np.array([[[0.0, 0.0, 1.0]]]), (len(matrix), 1, 3))], 1)
    return (to_grid @ square @ from_grid)[:, :2]


def warp(x: torch.Tensor, theta: torch.Tensor, fill: torch.Tensor, mode: str) -> torch.Tensor:
    """PIL's Image.transform(AFFINE) of whole-valued images: each output pixel centre mapped by `theta`
    (N, 2, 3; grid_theta of PIL's matrix) with affine_grid, sampled with grid_sample (edge pixels clamped, as
    PIL's filters do), pixels whose source lies outside the image set to `fill` (C,), truncated to whole values
    as PIL's filters do. A dozen ops for any batch."""
    n, c, h, w = x.shape
    if n == 0:  # affine_grid refuses an empty batch (a shape, known on the host: no device read)
        return x
    grid = F.affine_grid(theta.to(x.dtype), [n, c, h, w], align_corners=False)
    inside = ((grid >= -1) & (grid < 1)).all(-1).unsqueeze(1)
    sampled = F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False)
    # PIL truncates its double result; the float32 round trip through grid coordinates lands whole values a
    # hair below themselves, hence the small lift before truncating
    sampled = torch.floor(sampled + TRUNCATION_SLACK).clamp(0, 255)
    return torch.where(inside, sampled, fill.to(x.dtype).view(1, c, 1, 1))


def fill_colour(mean: tuple[float, ...]) -> tuple[int, ...]:
    """timm's img_mean fill: the normalisation mean in 0-255, rounded (create_transform's aa_params)."""
    return tuple(min(255, round(255 * v)) for v in mean)
