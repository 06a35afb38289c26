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
    """
    check_beam(beam)
    cfg = model.config
    b, k = src.shape[0], beam
    memory = model.encode(src)
    flat = torch.arange(b, device=src.device).repeat_interleave(k)
    state = model.init_state(memory.reorder(flat))
    scores = torch.zeros(b, k, device=src.device)
    scores[:, 1:] = float("-inf")  # all beams start identical: keep one so the first step has no duplicates
    tokens = torch.full((b * k,), cfg.bos_id, dtype=torch.long, device=src.device)
    prefixes = torch.zeros(b * k, 0, dtype=torch.long, device=src.device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = [False] * b
    limit = _limit(model, max_len)
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
        keep_origin = torch.zeros(b, k, dtype=torch.long)
        keep_token = torch.full((b, k), cfg.eos_id, dtype=torch.long)
        keep_score = torch.full((b, k), float("-inf"))
        for i in range(b):
            if done[i]:
                continue
            n = 0
            ranked = zip(top_scores[i].tolist(), origin[i].tolist(), token[i].tolist(), strict=True)
            for rank, (score, o, tok) in enumerate(ranked):
                if score == float("-inf") or n == k:
                    break
                if tok == cfg.eos_id:
                    # only an EOS among the k best candidates ends a hypothesis (fairseq, Hugging Face): the
                    # other k candidates are there to refill the beams
                    if rank < k:
                        finished[i].append((score / (t + 1) ** lenpen, prefixes[i * k + o].tolist()))
                        finished[i] = sorted(finished[i], key=lambda h: h[0], reverse=True)[:k]
                else:
                    keep_origin[i, n], keep_token[i, n], keep_score[i, n] = o, tok, score
                    n += 1
            done[i] = len(finished[i]) >= k and finished[i][-1][0] >= _best_reachable(
                keep_score[i, 0].item(), t + 2, limit, lenpen)
        if all(done):
            break
        index = (torch.arange(b)[:, None] * k + keep_origin).view(-1).to(src.device)
        state.reorder(index)
        prefixes = torch.cat([prefixes.index_select(0, index), keep_token.view(-1, 1).to(src.device)], 1)
        tokens = keep_token.view(-1).to(src.device)
        scores = keep_score.to(src.device)
    return [max(f, key=lambda h: h[0])[1] if f else [] for f in finished]


def _best_reachable(logp: float, shortest: int, longest: int, lenpen: float) -> float:
    """Highest normalised score an active beam with summed log-probability `logp` can still end with:
    more tokens only lower logp (<= 0), so the bound takes the length that divides it most favourably."""
    if logp == float("-inf"):
        return logp
    return logp / (longest if lenpen > 0 else shortest) ** lenpen
