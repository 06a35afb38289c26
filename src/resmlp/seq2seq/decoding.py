"""Greedy and beam-search decoding over the models' incremental ``encode`` / ``init_state`` / ``step`` API.

Both return token ids without BOS/EOS. Generation stops at EOS or after ``max_len`` tokens
(the model's ``config.max_len`` at most: the decoder's cross-token matrix has no rows beyond it);
both force EOS at the last position, so at most max_len - 1 tokens come out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from resmlp.errors import ConfigError

# Beyond a few dozen, wider beams only cost: translation quality peaks around 4-10 (and often falls with
# more), while memory and time grow linearly (each beam holds its own decoder state) and the per-step
# bookkeeping here quadratically. The bound keeps a mistyped --beam from taking gigabytes.
MAX_BEAM = 64


def check_beam(beam: int) -> None:
    """A ConfigError unless 1 <= beam <= MAX_BEAM (commands check before loading or training anything)."""
    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
        raise ConfigError(f"beam size must be a whole number from 1 to {MAX_BEAM}, got {beam!r} "
                          "(the paper uses 4; 1 decodes greedily)")


def _limit(model: nn.Module, max_len: int | None) -> int:
    cap = model.config.max_len
    return cap if max_len is None else max(1, min(max_len, cap))


@torch.no_grad()
def greedy(model: nn.Module, src: torch.Tensor, max_len: int | None = None) -> list[list[int]]:
    """Most likely next token at every step, for a batch of sources (B, S)."""
    cfg = model.config
    state = model.init_state(model.encode(src))
    tokens = torch.full((src.shape[0],), cfg.bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros_like(tokens, dtype=torch.bool)
    out = []
    limit = _limit(model, max_len)
    for t in range(limit):
        nxt = model.step(tokens, state).argmax(-1).masked_fill(done, cfg.eos_id)
        if t == limit - 1:  # out of room: end every sentence, as beam search does
            nxt.fill_(cfg.eos_id)
        out.append(nxt)
        done |= nxt.eq(cfg.eos_id)
        if done.all():
            break
        tokens = nxt
    rows = torch.stack(out, 1).tolist()
    return [row[: row.index(cfg.eos_id)] if cfg.eos_id in row else row for row in rows]


@torch.no_grad()
def beam_search(
    model: nn.Module, src: torch.Tensor, beam: int = 4, lenpen: float = 0.6, max_len: int | None = None
) -> list[list[int]]:
    """Batched beam search; a finished hypothesis scores sum(log p) / length**lenpen (length incl. EOS).

    Each sentence keeps its `beam` best finished hypotheses and stops once no active beam can still beat
    the worst of them (its log-probability only falls; the bound takes the most favourable final length),
    so unlikely hypotheses that end early cannot crowd out a likely longer one. The best normalised wins.
    All bookkeeping stays on the model's device: one host read per step (has every sentence stopped?) and
    one for the result.
    """
    check_beam(beam)
    cfg = model.config
    b, k, device = src.shape[0], beam, src.device
    limit = _limit(model, max_len)
    memory = model.encode(src)
    state = model.init_state(memory.reorder(torch.arange(b, device=device).repeat_interleave(k)))
    scores = torch.zeros(b, k, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: keep one so the first step has no duplicates
    tokens = torch.full((b * k,), cfg.bos_id, dtype=torch.long, device=device)
    prefixes = torch.zeros(b * k, 0, dtype=torch.long, device=device)
    # the k best finished hypotheses of each sentence, best first: normalised score, tokens (EOS-padded)
    finished_score = torch.full((b, k), float("-inf"), device=device)
    finished_tokens = torch.full((b, k, limit), cfg.eos_id, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    rows = torch.arange(b, device=device)[:, None]
    for t in range(limit):
        logp = F.log_softmax(model.step(tokens, state).float(), dim=-1)
        vocab = logp.shape[-1]
        if t == limit - 1:  # out of room: the only allowed continuation is EOS
            only_eos = torch.full_like(logp, float("-inf"))
            only_eos[:, cfg.eos_id] = 0.0
            logp = logp + only_eos
        cand = (scores.unsqueeze(-1) + logp.view(b, k, vocab)).view(b, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=1)
        origin, token = top_idx // vocab, top_idx % vocab
        live = (top_scores > float("-inf")) & ~done[:, None]
        is_eos = token == cfg.eos_id
        # only an EOS among the k best candidates ends a hypothesis (fairseq, Hugging Face): the other k
        # candidates are there to refill the beams
        ends = live & is_eos & (torch.arange(top_idx.shape[1], device=device) < k)
        finished_score, finished_tokens = _keep_best_finished(
            finished_score, finished_tokens, torch.where(ends, top_scores / (t + 1) ** lenpen, float("-inf")),
            prefixes.view(b, k, t).gather(1, origin[:, :, None].expand(-1, -1, t)), cfg.eos_id, k)
        # the k first live candidates that do not end go on, in rank order
        goes_on = live & ~is_eos
        slot = torch.where(goes_on, goes_on.long().cumsum(1) - 1, k)  # k: dropped
        keep_origin = torch.zeros(b, k + 1, dtype=torch.long, device=device)
        keep_token = torch.full((b, k + 1), cfg.eos_id, dtype=torch.long, device=device)
        keep_score = torch.full((b, k + 1), float("-inf"), device=device)
        slot = slot.clamp(max=k)
        keep_origin.scatter_(1, slot, torch.where(goes_on, origin, 0))
        keep_token.scatter_(1, slot, torch.where(goes_on, token, cfg.eos_id))
        keep_score.scatter_(1, slot, torch.where(goes_on, top_scores, float("-inf")))
        keep_origin, keep_token = keep_origin[:, :k].contiguous(), keep_token[:, :k].contiguous()
        keep_score = keep_score[:, :k].contiguous()
        bound = keep_score[:, 0] / float(limit if lenpen > 0 else t + 2) ** lenpen  # _best_reachable
        done |= (finished_score[:, -1] > float("-inf")) & (finished_score[:, -1] >= bound)
        if bool(done.all()):  # the one host read of a step
            break
        index = (rows * k + keep_origin).view(-1)
        state.reorder(index)
        prefixes = torch.cat([prefixes.index_select(0, index), keep_token.view(-1, 1)], 1)
        tokens = keep_token.view(-1)
        scores = keep_score
    best = torch.cat([finished_score[:, :1].double(), finished_tokens[:, 0].double()], 1).tolist()  # one read
    return [_until_eos([int(v) for v in row[1:]], cfg.eos_id) if row[0] > float("-inf") else [] for row in best]


def _keep_best_finished(scores: torch.Tensor, tokens: torch.Tensor, new_scores: torch.Tensor,
                        new_prefixes: torch.Tensor, eos: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of the kept and the newly finished hypotheses (their prefixes, EOS-padded), best first;
    among equal scores the earlier first (a stable sort, as Python's sorted)."""
    new_tokens = tokens.new_full((*new_prefixes.shape[:2], tokens.shape[2]), eos)
    new_tokens[:, :, : new_prefixes.shape[2]] = new_prefixes
    all_scores = torch.cat([scores, new_scores], 1)
    order = all_scores.sort(dim=1, descending=True, stable=True).indices[:, :k]
    all_tokens = torch.cat([tokens, new_tokens], 1)
    return all_scores.gather(1, order), all_tokens.gather(1, order[:, :, None].expand(-1, -1, tokens.shape[2]))


def _until_eos(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos)] if eos in row else row


def _best_reachable(logp: float, shortest: int, longest: int, lenpen: float) -> float:
    """Highest normalised score an active beam with summed log-probability `logp` can still end with:
    more tokens only lower logp (<= 0), so the bound takes the length that divides it most favourably."""
    if logp == float("-inf"):
        return logp
    return logp / (longest if lenpen > 0 else shortest) ** lenpen
