"""The training budget a translation run implies, printed when it starts (issue 49): tokens per update, and the
warm-up and the whole run in updates and in epochs of the run's own corpus, so that a recipe's numbers (32k
warm-up updates: the paper's; the batch: Ott et al.'s; see seq2seq/recipes.py) are seen in data before hours
are spent on them."""

from __future__ import annotations

import math

from resmlp.seq2seq.config import TranslationConfig
from resmlp.seq2seq.data import token_batches


def updates_per_epoch(batches: int, world: int, update_freq: int) -> int:
    """Updates of one epoch: each process takes an equal share of the batches (the rest is dropped, as the
    trainer does) and makes an update of every `update_freq` of them, the last of the epoch with what is left."""
    return max(1, math.ceil((batches // world) / update_freq))


def budget_line(cfg: TranslationConfig, batches: int, world: int, pairs: int, tokens: int) -> str:
    """One line: the run's tokens per update, and its warm-up and total updates in epochs of its corpus of
    `pairs` pairs, `tokens` tokens and `batches` batches of --max-tokens (the longer side of each pair counted,
    as the batches count them)."""
    per_epoch = updates_per_epoch(batches, world, cfg.update_freq)
    per_update = cfg.max_tokens * cfg.update_freq * world
    return (f"budget: {per_update:,} tokens per update at most ({cfg.max_tokens} per batch x {cfg.update_freq} "
            f"batches (--update-freq) x {world} processes); this corpus ({pairs:,} pairs, {tokens:,} tokens) is "
            f"{per_epoch:,} updates an epoch; warm-up {cfg.warmup_steps:,} updates = "
            f"{cfg.warmup_steps / per_epoch:,.2f} epochs; run {cfg.max_steps:,} updates (--max-steps) = "
            f"{cfg.max_steps / per_epoch:,.2f} epochs, unless --max-minutes {cfg.max_minutes:g} ends it first")


def corpus_budget_line(cfg: TranslationConfig, src_ids: list[list[int]], tgt_ids: list[list[int]], source_eos: int,
                       world: int) -> str:
    """`budget_line` of the encoded training pairs, batched as the trainer batches them (the number of batches
    does not depend on the seed, which only shuffles whole batches)."""
    src_lens, tgt_lens = [len(s) + source_eos for s in src_ids], [len(t) for t in tgt_ids]
    batches = len(token_batches(src_lens, tgt_lens, cfg.max_tokens, seed=0))
    tokens = sum(max(s, t + 1) for s, t in zip(src_lens, tgt_lens, strict=True))  # the size token_batches gives a pair
    return budget_line(cfg, batches, world, len(src_ids), tokens)
