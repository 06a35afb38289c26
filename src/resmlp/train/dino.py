"""DINO self-supervised pre-training pieces (Caron et al., 2021) for ResMLP and Mixer.

timm and torch have no DINO head, loss or multi-crop transform, so they are written here, following the
DINO paper: projection head with a weight-normalised last layer, centred and sharpened teacher targets
with a temperature warm-up, and a student/teacher pair whose teacher is an EMA of the student.

Local crops: the cross-patch matrix fixes the number of patches, so a network of this family only takes
its training resolution. We resize local crops to the global crop size (option (a)) rather than
resampling every cross-patch matrix for the local grid (option (b)): (a) trains exactly the weights used
at test time and keeps one code path, while (b) would back-propagate through an interpolation of A and
teach the student a second, approximate network. The price is that local crops cost as much compute as
global ones; with few local crops on small images that is affordable.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torchvision import transforms as T


class DINOHead(nn.Module):
    """MLP (in -> hidden -> hidden -> bottleneck), l2-normalisation, weight-normalised last layer."""

    def __init__(self, in_dim: int, out_dim: int = 4096, hidden_dim: int = 512, bottleneck_dim: int = 128,
                 num_layers: int = 3, norm_last_layer: bool = True) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < num_layers - 1:
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = nn.utils.parametrizations.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.parametrizations.weight.original0.data.fill_(1.0)  # the norm g
        if norm_last_layer:  # DINO's stabiliser: the output vectors stay unit-norm
            self.last_layer.parametrizations.weight.original0.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class DINOModel(nn.Module):
    """Backbone (pooled pre-logits features) followed by the DINO head; takes a list of crops."""

    def __init__(self, backbone: nn.Module, head: DINOHead) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, crops: list[torch.Tensor]) -> torch.Tensor:
        # crops of one size share a batch: one backbone call for all of them
        feats = self.backbone.forward_head(self.backbone.forward_features(torch.cat(crops)), pre_logits=True)
        return self.head(feats)


class DINOLoss(nn.Module):
    """Cross-entropy between sharpened, centred teacher outputs (global crops) and student outputs (all)."""

    def __init__(self, out_dim: int, num_crops: int, teacher_temp: float = 0.04, warmup_teacher_temp: float = 0.04,
                 warmup_epochs: int = 0, epochs: int = 100, student_temp: float = 0.1,
                 center_momentum: float = 0.9) -> None:
        super().__init__()
        self.num_crops = num_crops
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))
        warmup = torch.linspace(warmup_teacher_temp, teacher_temp, warmup_epochs) if warmup_epochs else torch.empty(0)
        self.teacher_temps = torch.cat([warmup, torch.full((max(epochs - warmup_epochs, 1),), teacher_temp)])

    def forward(self, student_out: torch.Tensor, teacher_out: torch.Tensor, epoch: int) -> torch.Tensor:
        temp = float(self.teacher_temps[min(epoch, len(self.teacher_temps) - 1)])
        student = (student_out.float() / self.student_temp).log_softmax(-1).chunk(self.num_crops)
        teacher = F.softmax((teacher_out.float() - self.center) / temp, dim=-1).detach().chunk(2)
        total, pairs = 0.0, 0
        for t_idx, t in enumerate(teacher):
            for s_idx, s in enumerate(student):
                if s_idx == t_idx:  # a crop is never its own target
                    continue
                total = total + torch.sum(-t * s, dim=-1).mean()
                pairs += 1
        self.update_center(teacher_out)
        return total / pairs

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        batch_center = teacher_out.float().sum(dim=0, keepdim=True)
        count = torch.tensor(float(len(teacher_out)), device=teacher_out.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_center)
            dist.all_reduce(count)
        self.center.mul_(self.center_momentum).add_(batch_center / count, alpha=1 - self.center_momentum)


def cosine_schedule(start: float, end: float, total_steps: int) -> list[float]:
    """One value per step, cosine from `start` to `end` (DINO's teacher momentum and weight decay)."""
    if total_steps <= 1:
        return [start]
    return [end - (end - start) * (math.cos(math.pi * i / (total_steps - 1)) + 1) / 2 for i in range(total_steps)]


class MultiCropTransform:
    """2 global crops + `num_local` local crops of one PIL image, all returned at the global size."""

    def __init__(self, img_size: int, mean: tuple[float, ...], std: tuple[float, ...], num_local: int = 4,
                 global_scale: tuple[float, float] = (0.4, 1.0), local_scale: tuple[float, float] = (0.05, 0.4),
                 local_size: int | None = None, grayscale: bool = False) -> None:
        local_size = local_size or max(img_size * 3 // 7, 8)
        # Grayscale images keep DINO's brightness and contrast jitter: without any photometric change two
        # crops of one image share its intensity histogram, a shortcut that matches views without shape.
        jitter = T.ColorJitter(0.4, 0.4) if grayscale else T.ColorJitter(0.4, 0.4, 0.2, 0.1)
        color = [T.RandomApply([jitter], p=0.8)] + ([] if grayscale else [T.RandomGrayscale(p=0.2)])
        finish = [T.ToTensor(), T.Normalize(mean, std)]
        flip = T.RandomHorizontalFlip()
        blur = T.GaussianBlur(3, sigma=(0.1, 2.0))
        self.global_views = [  # DINO's two global views: blurred always / rarely, the second solarised at 0.2
            T.Compose([T.RandomResizedCrop(img_size, scale=global_scale, interpolation=T.InterpolationMode.BICUBIC),
                       flip, *color, T.RandomApply([blur], p=p_blur), T.RandomSolarize(128, p=p_solarize), *finish])
            for p_blur, p_solarize in ((1.0, 0.0), (0.1, 0.2))
        ]
        # option (a): crop small, then resize to the global size the cross-patch matrix expects
        self.local_view = T.Compose([
            T.RandomResizedCrop(local_size, scale=local_scale, interpolation=T.InterpolationMode.BICUBIC),
            T.Resize(img_size, interpolation=T.InterpolationMode.BICUBIC), flip, *color,
            T.RandomApply([blur], p=0.5), *finish])
        self.num_local = num_local

    def __call__(self, image: Image.Image) -> list[torch.Tensor]:
        return [view(image) for view in self.global_views] + [self.local_view(image) for _ in range(self.num_local)]
