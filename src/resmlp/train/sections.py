"""The training config's sections: one dataclass per recipe section, and `TrainConfig` that holds them.

The defaults here are what a recipe that omits a key gets; resmlp.train.validation checks every value and
resmlp.train.config reads recipes and overrides into these classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from resmlp.build import ModelName, model_input, parse_model_name
from resmlp.models.registry import model_config
from resmlp.models.resmlp import ResMLPConfig

TASKS = ("supervised", "distillation", "finetune", "dino")
CLIP_MODES = ("norm", "per_param")  # train.clip_mode
# ResMLPConfig fields that are training hyper-parameters: a fine-tuning run may set them, its checkpoint not
TRAINING_FIELDS = ("drop_rate", "drop_path_rate")


@dataclass
class DataConfig:
    # the data source in one grammar (resmlp.data.sources): folder:DIR, wds:PATTERN, hf:DIR, fashion-mnist[:DIR],
    # cifar10:DIR, cifar100:DIR, synthetic. None: kind + dir below, the older spelling of the same
    source: str | None = None
    kind: str = "fashion-mnist"  # fashion-mnist | folder | wds | hf | cifar10 | cifar100 | synthetic
    dir: str | None = None  # None: the kind's default location (Fashion-MNIST: the Debian package)
    class_map: str | None = None  # folders: a text file, one class per line, its index the line number (timm's)
    streaming: bool = False  # hf: stream the dataset (an iterable) instead of memory-mapping it
    epoch_length: int | None = None  # wds: samples per epoch when the shards have no index.json
    mean: list[float] | None = None  # None: the dataset's statistics (ImageNet's for folders)
    std: list[float] | None = None
    crop_pct: float = 0.875  # evaluation: resize to img_size / crop_pct, then center-crop
    # validation images carved from train for kinds without a val split (Fashion-MNIST, CIFAR): class-stratified,
    # seeded; model selection uses them, the test split is scored once at the end. 0: validate on test (flagged)
    val_size: int = 5000
    val_seed: int = 0
    test_dir: str | None = None  # folder kind: the test images (DIR/test by default, when it exists)
    interpolation: str = "bicubic"
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333])
    hflip: float = 0.5
    color_jitter: float = 0.0
    auto_augment: str | None = None  # e.g. rand-m9-mstd0.5-inc1 (RandAugment)
    reprob: float = 0.0  # random erasing probability
    # random erasing's fill (timm's re_mode: pixel | rand | const) and most boxes per image (re_count): DeiT's
    # main.py defaults pixel, 1 (--remode, --recount); others run in timm's per-image transform only
    remode: str = "pixel"
    recount: int = 1
    mixup: float = 0.0  # Mixup alpha (0: off)
    cutmix: float = 0.0  # CutMix alpha (0: off)
    mixup_prob: float = 1.0  # probability that a batch is mixed at all (timm's Mixup prob; DeiT's --mixup-prob 1.0)
    repeated_aug: int = 0  # repeats per image (RepeatAugSampler); 0 or 1: off
    num_workers: int = 2
    # in-memory datasets (fashion-mnist, cifar, synthetic) without auto_augment/color_jitter: crop, flip and
    # erase whole batches in the training process (resmlp.data.device.batch_augment); false: timm's per-image transform
    batch_augment: bool = True
    # device: JPEGs decoded and the training augmentation (random-resized crop, flip, timm's RandAugment, erasing)
    # applied to whole batches where the model runs (resmlp.data.device.pipeline); timm: timm's per-image
    # transform in loader workers, the reference; auto: the faster of the two, measured before the first step
    # (resmlp.data.loading.choice). Recipes whose ops the device path covers set auto
    pipeline: str = "timm"
    synthetic_size: list[int] = field(default_factory=lambda: [256, 64])  # train, val (kind: synthetic)
    synthetic_classes: int = 4
    permute: str = "none"  # none | patch | global: one fixed pixel permutation on train and val (resmlp.data.permute)
    permute_patch: int = 4  # patch mode: patch side in pixels (use the model's patch size)
    permute_seed: int = 0
    # URLs in wds:/hf: (s3://, gs://, http(s)://; resmlp.data.sources.remote): an S3-compatible store's endpoint
    # (None: AWS, or botocore's AWS_ENDPOINT_URL); tries after the first of each request, seconds each connect or
    # read may wait, seconds before the second try (doubled each time); a shard that keeps failing: skip (named
    # and counted) or stop
    endpoint_url: str | None = None
    remote_retries: int = 5
    remote_timeout: float = 60.0
    remote_backoff: float = 1.0
    shard_errors: str = "skip"
    # node-local copies of remote shards (resmlp.data.sources.shard_cache), at most cache_gb GB (LRU); None: none
    cache_dir: str | None = None
    cache_gb: float = 100.0


@dataclass
class OptimConfig:
    name: str = "lamb"  # lamb | sgd | adamw
    lr: float = 5e-3
    reference_batch: int | None = None  # lr belongs to this global batch; scaled linearly. None: as is
    weight_decay: float = 0.05
    momentum: float = 0.9  # sgd only
    eps: float | None = None  # lamb / adamw epsilon; None: timm's default for the optimizer (Lamb 1e-6, AdamW 1e-8)
    layer_decay: float | None = None  # layer-wise lr decay (e.g. 0.75, fine-tuning); None: off


@dataclass
class ScheduleConfig:
    name: str = "cosine"  # cosine | step
    epochs: int = 300
    warmup_epochs: float = 5
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    decay_epochs: float = 30  # step only: multiply lr by decay_rate every decay_epochs
    decay_rate: float = 0.1
    # false: the cosine spans all epochs, warm-up included (timm's default, DeiT's); true: it starts after the
    # warm-up and spans the rest (timm's warmup_prefix with epochs - warmup_epochs: DINO's utils.cosine_scheduler)
    warmup_prefix: bool = False
    # update: the lr moves after every optimizer step (timm's train.py, step_on_epochs=False); epoch: once per
    # epoch, as DeiT's main.py steps it (lr_scheduler.step(epoch) after each epoch: epoch 0 trains entirely at
    # warmup_lr, epoch e >= 1 at timm's value for e - 1; resmlp.train.step.schedule_to)
    step_on: str = "update"


@dataclass
class LossConfig:
    label_smoothing: float = 0.0


@dataclass
class DistillConfig:
    teacher: str | None = None  # a model name (resmlp.build): checkpoint file, timm:NAME, torchvision:NAME
    type: str = "hard"  # hard (DeiT's: teacher argmax as a second label) | soft (KL at temperature tau)
    alpha: float = 0.5  # soft: weight of the KL term
    tau: float = 1.0  # soft: temperature
    weights: str | None = None  # weights file for a timm:/torchvision: teacher
    allow_random_teacher: bool = False  # a timm:/torchvision: teacher without weights is refused unless this is set
    # the user vouches that the teacher's logit i is the data's class i: admits a teacher whose file records no
    # class names (resmlp.train.teacher); a recorded order that differs from the data's is refused all the same
    classes_match: bool = False
    # keep each distinct training image's teacher output (in memory, keyed by its pixels): pays off when the
    # augmentation yields few distinct images (no crops, erasing, Mixup/CutMix, RandAugment; flips allowed).
    # On a GPU it makes every step wait for the host: the batch is hashed there (its pixels copied back) and
    # the cached outputs copied up; worth it only when the teacher costs far more than that copy
    cache: bool = False


@dataclass
class FinetuneConfig:  # used when model.name is a checkpoint file (ours, timm's, DeiT's, a DINO backbone)
    img_size: int | None = None  # new input resolution (cross-patch weights resized); None: the checkpoint's
    freeze: int | str | None = None  # N: freeze the stem and the first N blocks; all-but-head; None: train all


@dataclass
class DinoConfig:
    out_dim: int = 4096  # DINO head output (prototypes)
    hidden_dim: int = 512
    bottleneck_dim: int = 128
    norm_last_layer: bool = True
    num_local: int = 4  # local crops (resized to the global size, see resmlp.train.dino)
    global_scale: list[float] = field(default_factory=lambda: [0.4, 1.0])
    local_scale: list[float] = field(default_factory=lambda: [0.05, 0.4])
    local_size: int | None = None  # crop size before resizing to the global size; None: 3/7 of it
    teacher_temp: float = 0.04
    warmup_teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 0
    student_temp: float = 0.1
    center_momentum: float = 0.9
    momentum_teacher: float = 0.996  # EMA momentum at the start; cosine to 1.0 at the end
    weight_decay_end: float | None = 0.4  # cosine from optim.weight_decay to this (DINO); None: constant
    freeze_last_layer_epochs: int = 1
    knn_k: int = 20
    knn_temperature: float = 0.07


@dataclass
class TrainSection:
    batch_size: int = 256  # GLOBAL batch (all processes, all accumulation steps)
    grad_accum: int = 1
    clip_grad: float | None = None
    # norm: one global norm over all gradients (timm's --clip-mode norm); per_param: each parameter's gradient
    # norm clipped alone (DINO's utils.clip_gradients)
    clip_mode: str = "norm"
    amp: str = "auto"  # auto (runtime.resolve_amp) | bf16 | fp16 (GPU, with a scaler) | fp32 (= none)
    # auto: compile when the measured eager step says the rest of the run pays for it (resmlp.train.step);
    # true / false force it (set one of them for runs that must repeat bit for bit)
    compile: bool | str = "auto"
    log_every_steps: int = 0  # read the loss on the host every N steps; 0: every half second
    channels_last: bool = False
    # the fused training step of the paper's block (resmlp.models.fused_block): same arithmetic, fewer
    # passes over memory; false runs the plain blocks (for comparison or debugging)
    fused_step: bool = True
    ema: bool = False  # evaluate and save an exponential moving average of the weights
    ema_decay: float = 0.99996
    seed: int = 0
    deterministic: bool = False
    checkpoint_every_steps: int = 0  # 0: only at the end of each epoch
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # CPU threads for compute (torch.set_num_threads); None: torch's default
    progress: bool = True
    checkpoint_hist: int = 0  # keep the N best epochs' checkpoints (timm's --checkpoint-hist; resmlp.train.history)
    log_wandb: bool = False  # also log each epoch's metrics to Weights & Biases (timm's --log-wandb)
    log_mlflow: bool = False  # ... and/or to MLflow (resmlp.reporting.RunLogs)
    experiment: str | None = None  # the W&B project / MLflow experiment; None: resmlp


@dataclass
class TrainConfig:
    recipe: str = "custom"
    task: str | None = None  # one of TASKS; None: finetune for a checkpoint model, distillation with a teacher
    model: dict[str, Any] = field(default_factory=lambda: {"name": "resmlp_s12"})
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainSection = field(default_factory=TrainSection)
    distill: DistillConfig = field(default_factory=DistillConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    dino: DinoConfig = field(default_factory=DinoConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def model_name(self) -> ModelName:
        """model.name parsed by the one model grammar (resmlp.build)."""
        return parse_model_name(self.model["name"])

    @property
    def model_overrides(self) -> dict[str, Any]:
        """The model section's keys besides name: ResMLPConfig fields or timm constructor arguments."""
        return {k: v for k, v in self.model.items() if k != "name"}

    @property
    def constructor_overrides(self) -> dict[str, Any]:
        """The model section's keys a timm/torchvision constructor is given: its classes come from the data and
        its image size is the data's (timm models take any)."""
        return {k: v for k, v in self.model_overrides.items() if k not in ("img_size", "num_classes")}

    def model_config(self, num_classes: int | None = None) -> ResMLPConfig:
        """The ResMLPConfig of a preset `model` (preset + overrides); num_classes from the data unless given."""
        overrides = self.model_overrides
        if num_classes is not None:
            overrides.setdefault("num_classes", num_classes)
        return model_config(self.model["name"], **overrides)

    @property
    def task_name(self) -> str:
        """`task`, or inferred: finetune for a checkpoint model, distillation with a teacher, else supervised."""
        if self.task is not None:
            return self.task
        if self.model_name.kind == "file":
            return "finetune"
        return "distillation" if self.distill.teacher else "supervised"

    def input_shape(self) -> tuple[int, int]:
        """(in_chans, img_size) the model takes; a fine-tuning run at finetune.img_size."""
        in_chans, img_size = model_input(self.model_name, self.model_overrides)
        return in_chans, self.finetune.img_size or img_size


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "schedule": ScheduleConfig, "loss": LossConfig,
            "train": TrainSection, "distill": DistillConfig, "finetune": FinetuneConfig, "dino": DinoConfig}
