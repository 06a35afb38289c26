"""Greedy and beam search: beam 1 == greedy, beam finds the best sequence, padding-invariant output."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from resmlp.errors import ConfigError
from resmlp.seq2seq.decoding import MAX_BEAM, beam_search, greedy
from resmlp.seq2seq.model import Memory, build_translation_model, translation_model_config

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4


class TableModel(torch.nn.Module):
    """Hand-checkable 'model': next-token probabilities depend only on the prefix, from a table.

    First token: A 0.6, B 0.4. After A every continuation is uncertain (EOS 0.3, A 0.35, B 0.35);
    after B, EOS is certain. Best sequence: "B" (p 0.4); greedy takes A first and ends below 0.35.
    """

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS, max_len=4)

    def probs(self, prefix: tuple[int, ...]) -> dict[int, float]:
        if not prefix:
            return {A: 0.6, B: 0.4}
        if prefix[-1] == B:
            return {EOS: 1.0}
        return {EOS: 0.3, A: 0.35, B: 0.35}

    def encode(self, src):
        return Memory(torch.zeros(src.shape[0], 1, 1), torch.zeros(src.shape[0], 1, dtype=torch.bool))

    def init_state(self, memory):
        state = SimpleNamespace(prefix=torch.zeros(memory.out.shape[0], 0, dtype=torch.long))
        state.reorder = lambda index: setattr(state, "prefix", state.prefix.index_select(0, index))
        return state

    def step(self, tokens, state):
        if state.prefix.shape[1] or tokens[0] != BOS:
            state.prefix = torch.cat([state.prefix, tokens[:, None]], 1)
        logits = torch.full((tokens.shape[0], 5), -1e9)
        for r, row in enumerate(state.prefix.tolist()):
            for tok, p in self.probs(tuple(row)).items():
                logits[r, tok] = math.log(p)
        return logits

    def sequence_logprob(self, seq: tuple[int, ...]) -> float:
        total = 0.0
        for t, tok in enumerate(seq):
            p = self.probs(seq[:t]).get(tok, 0.0)
            if p == 0.0:
                return float("-inf")
            total += math.log(p)
        return total


def test_beam_finds_the_most_likely_sequence_greedy_misses():
    model = TableModel()
    src = torch.ones(1, 1, dtype=torch.long)
    # exhaustive search over every sequence ending in EOS within max_len tokens
    candidates = [seq + (EOS,) for n in range(4) for seq in itertools.product((A, B), repeat=n)]
    best = max(candidates, key=model.sequence_logprob)
    assert best == (B, EOS)
    assert beam_search(model, src, beam=2, lenpen=0.0) == [[B]]
    assert greedy(model, src) != [[B]]


class LongBestModel(TableModel):
    """A confident model whose best output is the longest: A A A (p 0.86). The unlikely B (0.06) and B A
    (0.02) end first; a search that stops once `beam` hypotheses have ended returns B."""

    def __init__(self) -> None:
        super().__init__()
        self.config.max_len = 6

    def probs(self, prefix: tuple[int, ...]) -> dict[int, float]:
        table = {(): {A: 0.9, B: 0.1}, (A,): {A: 0.98, EOS: 0.01, B: 0.01}, (B,): {EOS: 0.6, A: 0.2, B: 0.2},
                 (A, A): {A: 0.98, EOS: 0.01, B: 0.01}, (B, A): {EOS: 1.0}, (A, A, A): {EOS: 1.0}}
        return table.get(prefix, {EOS: 1.0})


@pytest.mark.parametrize("lenpen", [0.0, 0.6, 1.0])
def test_beam_keeps_searching_while_a_live_beam_can_beat_the_ended_ones(lenpen):
    model = LongBestModel()
    assert model.sequence_logprob((A, A, A, EOS)) > model.sequence_logprob((B, EOS)) > model.sequence_logprob(
        (B, A, EOS))
    assert beam_search(model, torch.ones(1, 1, dtype=torch.long), beam=2, lenpen=lenpen) == [[A, A, A]]


def random_model(arch: str):
    torch.manual_seed(6)  # outputs of several lengths: some end with EOS, some run to max_len
    model = build_translation_model(translation_model_config("tiny", 19, arch=arch, dropout=0.0))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return model.eval()


@pytest.mark.parametrize("arch", ["resmlp", "transformer"])
def test_beam_one_equals_greedy(arch):
    model = random_model(arch)
    src = torch.randint(3, 19, (4, 7), generator=torch.Generator().manual_seed(2))
    src[2, 4:] = PAD
    out = greedy(model, src)
    assert beam_search(model, src, beam=1, lenpen=0.0) == out
    assert any(len(x) > 0 for x in out)
    assert all(len(x) <= model.config.max_len for x in out)


@pytest.mark.parametrize("decode", ["greedy", "beam"])
def test_translation_same_alone_and_in_padded_batch(decode):
    model = random_model("resmlp")
    src = torch.randint(3, 19, (4, 10), generator=torch.Generator().manual_seed(3))
    src[1, 3:] = PAD
    run = (lambda s: greedy(model, s)) if decode == "greedy" else (lambda s: beam_search(model, s, beam=3))
    assert run(src[1:2, :3])[0] == run(src)[1]


def test_beam_search_respects_max_len_and_ends_every_hypothesis():
    model = random_model("resmlp")
    src = torch.randint(3, 19, (3, 5), generator=torch.Generator().manual_seed(4))
    out = beam_search(model, src, beam=4, max_len=3)
    assert len(out) == 3 and all(len(x) <= 2 for x in out)  # 3 positions: at most 2 tokens + EOS


@pytest.mark.parametrize("beam", [0, -3, MAX_BEAM + 1, 100_000, 2.5])
def test_beam_sizes_out_of_range_are_refused_with_a_message_before_any_work(beam):
    model = random_model("resmlp")
    with pytest.raises(ConfigError, match=rf"beam size must be a whole number from 1 to {MAX_BEAM}"):
        beam_search(model, torch.randint(3, 19, (1, 4)), beam=beam)
    assert len(beam_search(model, torch.randint(3, 19, (1, 4)), beam=MAX_BEAM)) == 1
