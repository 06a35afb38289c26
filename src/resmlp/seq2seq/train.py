"""Training loop and evaluation for the translation models.

A compact loop of its own (the image `Trainer` does not handle token batches or decoding): token-based
batches, gradients accumulated over `update_freq` of them per update (fairseq's --update-freq), label-smoothed
cross-entropy, Adagrad + linear warm-up (paper) then constant (this project's choice) or Adam + inverse-sqrt. Devices,
torchrun DDP, autocast, threads and the fp16 gradient scaler come from `resmlp.runtime`, as for the image
models: one process per GPU (`cuda:LOCAL_RANK`) when GPUs are visible, else the CPU.

Output directory, owned by the run (`seq2seq.runfolder` reads it as untrusted; every write is an `atomic_write`):
``data/`` (a built-in task's corpus), ``tokenizer.model`` (sentencepiece bytes), ``config.json`` (training
options), ``checkpoint.pt`` (model, optimizer, scheduler, step, seconds trained, model config), with
`average_last` > 1 the last checkpoints' weights (``checkpoint_STEP.pt``) and their mean (``checkpoint_avgN.pt``),
``log.csv``, ``summary.json``, ``test.hyp`` (detokenised test translations). A new run writes them all, in that
order, over what a run killed before its first checkpoint left; a resume reads them and refuses other options.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resmlp.command_files import note_inputs
from resmlp.errors import CheckpointError, ConfigError
from resmlp.fileio import atomic_write, guarded_subfolder, output_lock, remove_stale_temporaries
from resmlp.hostinfo import host_info
from resmlp.runtime import (
    DistInfo,
    all_reduce_sum,
    autocast,
    barrier,
    copy_to,
    grad_scaler,
    init_distributed,
    process_settings,
    resolve_amp,
    shutdown,
)
from resmlp.seq2seq.averaging import drop_checkpoints_after, keep_checkpoint, write_average
from resmlp.seq2seq.budget import corpus_budget_line
from resmlp.seq2seq.config import TranslationConfig, check_resumable
from resmlp.seq2seq.data import (
    SPLITS,
    Tokenizer,
    collate,
    encode_pairs,
    is_blank,
    read_parallel,
    source_batch,
    split_paths,
    token_batches,
)
from resmlp.seq2seq.decoding import beam_search, greedy
from resmlp.seq2seq.model import Seq2SeqBase, build_translation_model
from resmlp.seq2seq.runfolder import (
    CHECKPOINT,
    CONFIG,
    TOKENIZER,
    RunLog,
    check_training_memory,
    checkpoint_model_config,
    model_from_checkpoint,
    read_run_config,
    read_translation_checkpoint,
    restore_training_state,
    write_run_config,
)
from resmlp.seq2seq.scoring import moses_tokenizer, scores
from resmlp.seq2seq.tasks import make_number_task


def resolve_precision(precision: str, device: torch.device) -> str:
    """The runtime's amp name ('none', 'bf16', 'fp16') for a translation precision on `device`."""
    return resolve_amp("none" if precision == "fp32" else precision, device)


# ------------------------------------------------------------------------------------- distributed
def _any_rank(flag: bool, info: DistInfo) -> bool:
    """True if any process says so (keeps ranks stepping in lock-step when one hits the time budget)."""
    return bool(all_reduce_sum(torch.tensor([float(flag)]), info).item() > 0)


def _on(device: torch.device, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(copy_to(t, device) for t in tensors)  # through page-locked memory: the host does not wait


# ---------------------------------------------------------------------------------- optimisation
def make_optimizer(model: nn.Module, cfg: TranslationConfig):
    """Adagrad with linear warm-up (paper 3.6: "32k steps of linear warmup") then constant, or Adam with
    inverse-sqrt decay. The constant after the warm-up is this project's choice: section 3.6 gives the warm-up
    only, and fairseq's scaling_nmt recipe of Ott et al. decays as inverse_sqrt (with Adam)."""
    warm = max(1, cfg.warmup_steps)
    if cfg.optimizer == "adagrad":
        opt = torch.optim.Adagrad(model.parameters(), lr=cfg.lr)

        def factor(step: int) -> float:
            return min(1.0, (step + 1) / warm)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)

        def factor(step: int) -> float:
            return min((step + 1) / warm, math.sqrt(warm / (step + 1)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _accumulate(net: nn.Module, group: list[tuple[torch.Tensor, ...]], loss_fn: nn.Module, scaler, device,
                amp: str, info: DistInfo) -> tuple[torch.Tensor, int]:
    """Forward and backward of the batches of one update, the gradients summed: each batch's summed token loss
    divided by the update's target tokens (counted on the host), so the gradient is the update's per-token mean
    as fairseq's (sum over the accumulated batches, divided by their sample size). DDP averages across processes
    once, at the last batch (no_sync before it): the mean of the processes' per-token means, where fairseq divides
    by all processes' tokens (the same when they hold as many; token batches keep them close, and counting them
    across processes would cost a collective per update). Returns the update's loss (on the device), its tokens."""
    tokens = sum(int(tensors[2].ne(0).sum()) for tensors in group)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i, tensors in enumerate(group):
        src, tgt_in, tgt_out = _on(device, *tensors)
        syncs = i == len(group) - 1 or not info.enabled
        with contextlib.nullcontext() if syncs else net.no_sync():
            with autocast(device, amp):
                logits = net(src, tgt_in)
            loss = loss_fn(logits.float().flatten(0, 1), tgt_out.flatten()) / max(1, tokens)
            (loss if scaler is None else scaler.scale(loss)).backward()
        total += loss.detach().double()
    return total, tokens


def _optimizer_step(model: nn.Module, opt, scaler, clip_norm: float) -> None:
    """The update from the accumulated gradients; with fp16 they are unscaled before clipping."""
    if scaler is not None:
        scaler.unscale_(opt)
    if clip_norm > 0:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)
        scaler.update()
    opt.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------- saving
def save_checkpoint(out: Path, model: nn.Module, opt, sched, scaler, step: int, epoch: int,
                    seconds: float, batch_in_epoch: int = 0, keep: int = 1) -> None:
    """Everything resume needs: a resumed run skips the `batch_in_epoch` batches of the interrupted epoch
    already trained on and draws the same dropout masks (the random generator's state), so that in a single
    process it ends with the weights of an uninterrupted run. Written at update boundaries only (with
    update_freq > 1 an update's batches all come after the checkpoint), so a run killed in the middle of an
    update resumes from the last checkpoint, and that update is redone whole. keep > 1: the weights are also
    kept as checkpoint_STEP.pt, the last `keep` of them (averaging)."""
    device = next(model.parameters()).device
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "train_seconds": seconds,
             "model_config": model.config.to_dict(), "rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    atomic_write(out / CHECKPOINT, lambda p: torch.save(state, p))
    if keep > 1:
        keep_checkpoint(out, model, step, keep)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A `resmlp translate train` checkpoint, read weights-only (no code runs) onto the CPU and checked."""
    return read_translation_checkpoint(path)


def load_trained(path: str | Path, device: str | torch.device = "cpu"
                 ) -> tuple[Seq2SeqBase, Tokenizer, dict[str, Any]]:
    """Model (eval mode, on `device`), tokenizer and checkpoint dict from a run directory or its checkpoint.pt."""
    path = Path(path)
    out = path if path.is_dir() else path.parent
    _refuse_image_checkpoints(path, out)
    ckpt = load_checkpoint(out / CHECKPOINT if path.is_dir() else path)
    tok = Tokenizer.load(out / TOKENIZER)
    note_inputs(out / CHECKPOINT if path.is_dir() else path, out / TOKENIZER)  # no output of the command replaces them
    model = model_from_checkpoint(ckpt)
    if len(tok) != model.config.vocab_size:
        raise CheckpointError(f"{out / TOKENIZER} has {len(tok)} pieces but the checkpoint's model "
                              f"{model.config.vocab_size}: they come from different runs")
    return model.to(device).eval(), tok, ckpt


def _refuse_image_checkpoints(path: Path, out: Path) -> None:
    """An image classifier's run or checkpoint named where a translation run belongs: say what it is."""
    image_run = path.is_dir() and not (out / CHECKPOINT).exists() and (
        (out / "best.safetensors").exists() or (out / "last.pth").exists())
    if image_run or path.suffix == ".safetensors":
        raise ValueError(f"{path} is an image classifier's {'run' if image_run else 'checkpoint'} (resmlp train), not "
                         f"a translation run: translate eval/decode take a `resmlp translate train` output (its "
                         f"{CHECKPOINT} and {TOKENIZER}); classify images with: resmlp predict {path} IMAGE")


# ---------------------------------------------------------------------------------------- decoding
def translate(
    model: Seq2SeqBase, tok: Tokenizer, lines: list[str], beam: int = 4, lenpen: float = 0.6,
    batch_size: int = 64, precision: str = "fp32", progress: bool = False,
) -> list[str]:
    """Detokenised translations on the model's device; empty lines give empty translations, long lines are
    truncated. progress: a bar per batch on stderr (plain lines where it is no terminal)."""
    from resmlp.progress import progress_bar

    model.eval()
    device = next(model.parameters()).device
    amp = resolve_precision(precision, device)
    out = [""] * len(lines)
    todo = [i for i, line in enumerate(lines) if not is_blank(line)]
    eos = model.config.source_eos
    ids = tok.encode([lines[i] for i in todo], model.config.max_len - eos, what="source lines")
    order = sorted(range(len(todo)), key=lambda j: len(ids[j]))  # similar lengths: less padding
    starts = range(0, len(order), batch_size)
    for start in progress_bar(starts, desc="translate", unit="batch", file=sys.stderr, disable=not progress):
        chunk = order[start : start + batch_size]
        (src,) = _on(device, source_batch([ids[j] for j in chunk], eos))
        with autocast(device, amp):
            hyps = greedy(model, src) if beam == 1 else beam_search(model, src, beam=beam, lenpen=lenpen)
        for j, text in zip(chunk, tok.decode(hyps), strict=True):
            out[todo[j]] = text
    return out


# ---------------------------------------------------------------------------------------- training
@torch.no_grad()
def validation_loss(model: nn.Module, src_ids, tgt_ids, max_tokens: int, device: torch.device, amp: str) -> float:
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    loss_fn = nn.CrossEntropyLoss(ignore_index=0, reduction="sum")
    eos = model.config.source_eos
    for batch in token_batches([len(s) + eos for s in src_ids], [len(t) for t in tgt_ids], max_tokens, 0):
        batch_tensors = collate([src_ids[i] for i in batch], [tgt_ids[i] for i in batch], eos)
        count += int(batch_tensors[2].ne(0).sum())  # counted on the host, before the copy
        src, tgt_in, tgt_out = _on(device, *batch_tensors)
        with autocast(device, amp):
            logits = model(src, tgt_in)
        total += loss_fn(logits.float().flatten(0, 1), tgt_out.flatten()).double()
    model.train()
    return total.item() / max(1, count)  # the one read of the validation


def _prepare_data(cfg: TranslationConfig, out: Path, info: DistInfo, fresh: bool) -> Path:
    """The corpus: --data as given, or a built-in task's in OUT/data (never through a symlink planted there),
    written by a new run over whatever was there, kept by a resume (its checkpoint was written after it)."""
    if cfg.task is None:
        return Path(cfg.data)
    data = out / "data"
    if info.is_main:
        guarded_subfolder(data)
        remove_stale_temporaries(data)
        complete = all((data / f"{split}.{side}").is_file() for split in SPLITS for side in ("src", "tgt"))
        if fresh or not complete:
            make_number_task(cfg.task, data, train_size=cfg.task_train_size, seed=cfg.seed)
    barrier(info)
    return data


def _resume_state(cfg: TranslationConfig, out: Path) -> dict[str, Any]:
    """The checkpoint a resume continues, once the run's config.json shows the same options (what
    RESUMABLE_CHANGES names aside) and max_steps does not cut the run short."""
    path = out / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"nothing to resume: {path} does not exist (the run stopped before its first "
                                "checkpoint?); start it again without --resume")
    check_resumable(str(out / CONFIG), read_run_config(out), cfg)
    ckpt = read_translation_checkpoint(path, for_resume=True)
    if ckpt["step"] > cfg.max_steps:
        raise ConfigError(f"--max-steps {cfg.max_steps} is below the {ckpt['step']} steps the run has trained; a "
                          "resume can extend a run, not shorten it")
    return ckpt


def train_translation(cfg: TranslationConfig, resume: bool = False) -> dict[str, Any]:
    """Train, checkpoint, evaluate on the test split; returns (and writes) summary.json's content (rank 0;
    other ranks return {}). Threads, the torchrun process group and the device come from `resmlp.runtime`."""
    out = Path(cfg.output)
    if not resume and (out / CHECKPOINT).exists():
        raise ValueError(f"{out} already holds a checkpoint; pass --resume to continue it or pick another --output")
    moses_tokenizer()  # a broken sacremoses install stops the run now, not when it scores after training
    # before anything is read, built or written, at the most pieces the tokenizer can have (it may end with fewer)
    check_training_memory(cfg.model_config(cfg.vocab_size), cfg.max_tokens)
    with process_settings(cfg.threads):
        info = init_distributed(cfg.device)
        try:
            with output_lock(out if info.is_main else None):  # one run per output folder, as `resmlp train`
                return _train(cfg, info, out, resume)
        finally:
            shutdown(info)


def _train(cfg: TranslationConfig, info: DistInfo, out: Path, resume: bool) -> dict[str, Any]:
    from resmlp.progress import progress_bar

    rank, world, device = info.rank, info.world_size, info.device
    amp = resolve_precision(cfg.precision, device)
    torch.manual_seed(cfg.seed)
    ckpt = _resume_state(cfg, out) if resume else None
    if info.is_main:
        remove_stale_temporaries(out)  # of writes a killed run left unfinished (we hold the folder's lock)
    data = _prepare_data(cfg, out, info, fresh=ckpt is None)
    train_src, train_tgt = read_parallel(*split_paths(data, "train", cfg.src_suffix, cfg.tgt_suffix))
    valid_src, valid_tgt = read_parallel(*split_paths(data, "valid", cfg.src_suffix, cfg.tgt_suffix))

    if info.is_main and ckpt is None:  # a new run's own tokenizer and config, over any a killed run left
        tok = Tokenizer.train(train_src + train_tgt, cfg.vocab_size)
        atomic_write(out / TOKENIZER, lambda p: p.write_bytes(tok.model_bytes))
    if info.is_main:  # a resume's own max_steps, devices...: config.json says how to repeat the run
        write_run_config(out, cfg)
    barrier(info)
    tok = Tokenizer.load(out / TOKENIZER)
    mcfg = cfg.model_config(len(tok))
    src_ids, tgt_ids = encode_pairs(tok, train_src, train_tgt, mcfg.max_len, mcfg.source_eos, "train")
    vsrc, vtgt = encode_pairs(tok, valid_src, valid_tgt, mcfg.max_len, mcfg.source_eos, "valid")

    model = build_translation_model(mcfg).to(device)  # before the optimizer: its state lives on the device
    opt, sched = make_optimizer(model, cfg)
    scaler = grad_scaler(amp, device)
    step, epoch, seconds, skip = 0, 0, 0.0, 0
    if ckpt is not None:
        if checkpoint_model_config(ckpt) != mcfg:
            raise CheckpointError(f"{out / CHECKPOINT} holds another model than its run's config.json and "
                                  f"{TOKENIZER} describe: the folder was edited, or an earlier version of resmlp "
                                  "trained it (ReLU FFN, sources without EOS), which `translate eval` reads but a "
                                  "resume cannot continue")
        restore_training_state(out / CHECKPOINT, ckpt, model, opt, sched, scaler, device)
        step, epoch, seconds = ckpt["step"], ckpt["epoch"], ckpt["train_seconds"]
        skip = ckpt.get("batch_in_epoch", 0)  # 0 in files of earlier versions: the epoch restarts
        if info.is_main:
            drop_checkpoints_after(out, step)
    ddp_devices = [device.index] if device.type == "cuda" else None
    net = nn.parallel.DistributedDataParallel(model, device_ids=ddp_devices) if info.enabled else model
    loss_fn = nn.CrossEntropyLoss(ignore_index=0, label_smoothing=cfg.label_smoothing, reduction="sum")
    # the rows a killed run logged after its checkpoint are dropped: the resumed run logs those steps again
    run_log = RunLog(out, step if ckpt is not None else None) if info.is_main else None
    if info.is_main:  # what the run's numbers mean in this corpus, before hours are spent (after a resume's checks)
        print(corpus_budget_line(cfg, src_ids, tgt_ids, mcfg.source_eos, world), file=sys.stderr, flush=True)

    budget = cfg.max_minutes * 60
    first_step = step + 1  # this run's first step (a resume's too) logs at once: the run is seen to be working
    bar = progress_bar(total=cfg.max_steps, initial=step, desc="train", unit="step", file=sys.stderr,
                       disable=not (cfg.progress and info.is_main), min_interval_s=0)  # a line per log row
    model.train()
    started, tokens_seen, loss_n = time.time() - seconds, 0, 0
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # read once per log interval
    window_start, stop = time.time(), step >= cfg.max_steps or seconds >= budget  # finished: nothing to train
    with bar:
        while not stop:
            eos = mcfg.source_eos
            batches = token_batches([len(s) + eos for s in src_ids], [len(t) for t in tgt_ids], cfg.max_tokens,
                                    seed=cfg.seed * 1000 + epoch)
            batches = batches[rank : len(batches) - len(batches) % world : world]  # equal count per rank
            # an update takes the next update_freq batches (the epoch's last one what is left, as fairseq's
            # GroupedIterator); `skip` batches were trained on before the interruption (a whole number of updates)
            for position in range(skip, len(batches), cfg.update_freq):
                group = [collate([src_ids[i] for i in batch], [tgt_ids[i] for i in batch], eos)
                         for batch in batches[position : position + cfg.update_freq]]
                loss, tokens = _accumulate(net, group, loss_fn, scaler, device, amp, info)
                tokens_seen += tokens
                _optimizer_step(model, opt, scaler, cfg.clip_norm)
                sched.step()
                step += 1
                bar.update()
                loss_sum += loss
                loss_n += 1
                seconds = time.time() - started
                # processes agree on the time budget by a collective (a host wait on a GPU): with several, once
                # per log interval; max_steps is reached by all at the same step
                stop = step >= cfg.max_steps or (
                    (not info.enabled or step % cfg.log_every == 0) and _any_rank(seconds >= budget, info))
                evaluate_now = stop or step % cfg.eval_every == 0
                log_now = evaluate_now or step % cfg.log_every == 0 or step == first_step  # a first line early
                if info.is_main and log_now:
                    row = {"step": step, "epoch": epoch, "train_loss": round(loss_sum.item() / loss_n, 4),
                           "valid_loss": "", "lr": sched.get_last_lr()[0],
                           "tokens_per_s": round(tokens_seen * world / (time.time() - window_start), 1),
                           "train_seconds": round(seconds, 1)}
                    if evaluate_now:
                        row["valid_loss"] = round(validation_loss(model, vsrc, vtgt, cfg.max_tokens, device, amp), 4)
                        save_checkpoint(out, model, opt, sched, scaler, step, epoch, seconds,
                                        position + len(group), keep=cfg.average_last)
                    run_log.append(row)
                    bar.set_postfix(loss=row["train_loss"], valid=row["valid_loss"], refresh=False)
                if log_now:
                    loss_sum.zero_()
                    loss_n, tokens_seen, window_start = 0, 0, time.time()
                if stop:
                    break
            epoch, skip = epoch + 1, 0
    barrier(info)
    summary: dict[str, Any] = {}
    if info.is_main:
        scored, averaged = _scored_model(cfg, out, model, device)
        summary = (evaluate_translation(scored, tok, data, "test", cfg, out, progress=cfg.progress,
                                        limit=cfg.test_decode_limit) if cfg.test_decode_limit != 0 else
                   {"test": f"not decoded (--test-decode-limit 0); score it with: resmlp translate eval {out}"})
        summary.update(arch=cfg.arch, task=cfg.task, params=sum(p.numel() for p in model.parameters()),
                       steps=step, averaged_steps=averaged, update_freq=cfg.update_freq,
                       max_tokens_per_update=cfg.max_tokens * cfg.update_freq * world,
                       train_seconds=round(seconds, 1), max_minutes=cfg.max_minutes,
                       wall_seconds=round(seconds + summary.pop("decode_seconds", 0.0), 1), device=str(device),
                       processes=world, host=host_info("fp32" if amp == "none" else amp))
        atomic_write(out / "summary.json", lambda p: p.write_text(json.dumps(summary, indent=2)))
    return summary


def _scored_model(cfg: TranslationConfig, out: Path, model: Seq2SeqBase, device: torch.device
                  ) -> tuple[Seq2SeqBase, list[int] | None]:
    """The model the test split is decoded with: the trained one, or with average_last > 1 the mean of the last
    kept checkpoints (as many as the run wrote, up to average_last), written as checkpoint_avgN.pt, and their
    steps."""
    if cfg.average_last == 1:
        return model, None
    _, averaged = write_average(out, cfg.average_last, at_most=True)
    return model_from_checkpoint(averaged).to(device), averaged["averaged_steps"]


def evaluate_translation(model: Seq2SeqBase, tok: Tokenizer, data: Path, split: str, cfg: TranslationConfig,
                         out: Path | None = None, progress: bool = False, limit: int | None = None) -> dict[str, Any]:
    """Decode `split` (its first `limit` sentences, when given) with beam search and score it; writes
    {split}.hyp under `out` if given."""
    src, ref = read_parallel(*split_paths(data, split, cfg.src_suffix, cfg.tgt_suffix))
    src, ref = src[:limit], ref[:limit]  # None: all
    t0 = time.time()
    hyps = translate(model, tok, src, beam=cfg.beam, lenpen=cfg.lenpen, precision=cfg.precision,
                     progress=progress)
    lang = cfg.tgt_suffix if cfg.tgt_suffix.isalpha() and len(cfg.tgt_suffix) == 2 else "en"  # e.g. de, fr
    result = {**scores(hyps, ref, lang), "decode_seconds": round(time.time() - t0, 1), "sentences": len(ref),
              "beam": cfg.beam, "lenpen": cfg.lenpen}
    if out is not None:
        atomic_write(out / f"{split}.hyp", lambda p: p.write_text("".join(h + "\n" for h in hyps),
                                                                   encoding="utf-8"))
    return result
