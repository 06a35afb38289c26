"""`resmlp translate train --recipe wmt14-en-de|wmt14-en-fr`: the paper's section 3.6 values, each with its source."""

from __future__ import annotations

import pytest

from resmlp.cli import build_parser
from resmlp.seq2seq.recipes import RECIPES

# paper section 3.6: "Adagrad with learning rate 0.2, 32k steps of linear warmup, label smoothing 0.1, dropout rate
# 0.15 for En-De and 0.1 for En-Fr ... LayerScale parameter to 0.2 ... a beam of size 4"; dimension 512, hidden
# 2,048, 6 layers (base6)
PAPER = {"optimizer": "adagrad", "lr": 0.2, "warmup_steps": 32_000, "label_smoothing": 0.1, "layerscale_init": 0.2,
         "beam": 4, "preset": "base6"}
DROPOUT = {"wmt14-en-de": 0.15, "wmt14-en-fr": 0.1}
# Ott et al. (the setup the paper follows): joint BPE of 32K (En-De) / 40K (En-Fr); fairseq's scaling_nmt README:
# decoding --lenpen 0.6, training --max-tokens 3584 per GPU
OTT = {"wmt14-en-de": {"vocab_size": 32_000, "lenpen": 0.6, "max_tokens": 3584},
       "wmt14-en-fr": {"vocab_size": 40_000, "lenpen": 0.6, "max_tokens": 3584}}
# fairseq/models/transformer base_architecture: attention_dropout 0.0, activation_dropout 0.0
FAIRSEQ = {"attention_dropout": 0.0, "activation_dropout": 0.0}
# Vaswani et al. section 6.1: "averaging the last 5 checkpoints" (base models); 5.2: "We trained the base models for
# a total of 100,000 steps"
VASWANI = {"average_last": 5}
RUN_UPDATES = 100_000  # --max-steps' default, which the recipe keeps


def _train_args(*flags: str):
    return build_parser().parse_args(["translate", "train", "--data", "D", "--output", "O", *flags])


@pytest.mark.parametrize("recipe", sorted(DROPOUT))
def test_recipe_sets_the_papers_values_with_their_sources(recipe):
    args = _train_args("--recipe", recipe)
    expected = {**PAPER, "dropout": DROPOUT[recipe], **OTT[recipe], **FAIRSEQ, **VASWANI}
    assert {k: getattr(args, k) for k in expected} == expected
    assert args.max_steps is None and args.flag_defaults["max_steps"] == RUN_UPDATES
    sources = {k: source for k, (_, source) in RECIPES[recipe].items()}
    assert all(sources[k] == "paper 3.6" for k in (*PAPER, "dropout"))
    assert all(sources[k] == "Ott et al." for k in OTT[recipe])
    assert all(sources[k] == "fairseq transformer" for k in FAIRSEQ) and sources["average_last"] == "Vaswani et al."


@pytest.mark.parametrize(("world", "flags", "update_freq"), [
    ("8", [], 1),  # fairseq's scaling_nmt README: 8 GPUs, --max-tokens 3584
    ("1", [], 8),  # one process: the 8 GPUs' batches in one update
    ("3", [], 3),  # rounded up: 3 x 3 x 3584 = 32,256 tokens, the fewest batches reaching 28,672
    ("1", ["--max-tokens", "7168"], 4),  # larger batches (a bigger GPU): fewer of them per update
    ("8", ["--update-freq", "2"], 2),  # given: as given
])
def test_the_recipe_derives_update_freq_from_the_processes_and_prints_the_batch(world, flags, update_freq,
                                                                              monkeypatch, capsys):
    from resmlp.commands import translate
    from resmlp.seq2seq.recipes import TOKENS_PER_UPDATE

    assert TOKENS_PER_UPDATE[0] == 3584 * 8 == 28_672  # Ott et al.'s batch on one machine of 8 GPUs
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.delenv("RANK", raising=False)
    trained = []
    monkeypatch.setattr("resmlp.seq2seq.train.train_translation", lambda cfg, resume: trained.append(cfg) or {})
    args = _train_args("--recipe", "wmt14-en-de", *flags)
    assert translate.run_translate_train(args) == 0 and trained[0].update_freq == update_freq
    printed = capsys.readouterr().err
    tokens = int(flags[1]) if "--max-tokens" in flags else 3584
    assert f"{tokens} tokens per batch x {update_freq} batches per update (--update-freq) x {world} processes = " \
           f"{tokens * update_freq * int(world):,} tokens per update" in printed
    if "--update-freq" not in flags:
        assert tokens * update_freq * int(world) >= 28_672 > tokens * (update_freq - 1) * int(world)
    # issue 49: the batch is attributed to whom it belongs (the paper states none)
    assert "paper:" not in printed and "the recipe's 28,672: this project's choice" in printed
    monkeypatch.setenv("RANK", "1")  # other ranks print nothing
    translate.run_translate_train(args)
    assert "tokens per update" not in capsys.readouterr().err


def test_a_recipe_batch_beyond_update_freqs_range_or_a_bad_world_size_is_one_line(monkeypatch, capsys):
    from resmlp.cli import main

    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(["translate", "train", "--recipe", "wmt14-en-de", "--max-tokens", "16", "--data", "D",
                 "--output", "O"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1792 batches of --max-tokens 16" in err and "raise --max-tokens" in err
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert main(["translate", "train", "--recipe", "wmt14-en-de", "--data", "D", "--output", "O"]) == 2
    assert "WORLD_SIZE='two'" in capsys.readouterr().err


def test_without_recipe_one_batch_makes_an_update():
    from resmlp.commands.translate import _update_freq

    assert _update_freq(_train_args()) == 1


def test_flags_after_the_recipe_override_it_and_flags_before_it_are_refused(capsys):
    assert _train_args("--recipe", "wmt14-en-de", "--dropout", "0.3", "--preset", "base12").dropout == 0.3
    with pytest.raises(SystemExit) as e:
        _train_args("--warmup-steps", "100", "--recipe", "wmt14-en-de")
    assert e.value.code == 2 and "--warmup-steps came before --recipe wmt14-en-de" in capsys.readouterr().err


def test_without_recipe_the_defaults_stay():
    from resmlp.commands.translate import _fill_flags

    args = _train_args()
    _fill_flags(args, args.flag_defaults)  # as run_translate_train does: the flags left out take their defaults
    assert args.warmup_steps == 500 and args.dropout is None and args.recipe is None


def test_the_recipe_model_is_the_papers():
    from resmlp.seq2seq.model import translation_model_config

    args = _train_args("--recipe", "wmt14-en-de")
    cfg = translation_model_config(args.preset, 32_000, dropout=args.dropout, layerscale_init=args.layerscale_init)
    assert (cfg.dim, cfg.hidden, cfg.encoder_layers, cfg.decoder_layers) == (512, 2048, 6, 6)
    assert cfg.dropout == 0.15 and cfg.layerscale_init == 0.2


def test_tokenized_bleu_is_moses_with_fairseqs_compound_splitting_by_default():
    from resmlp.seq2seq.scoring import compound_split, scores

    # fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' (matches do not overlap)
    assert compound_split("a well-known x-y-z - b") == "a well ##AT##-##AT## known x ##AT##-##AT## y-z - b"
    refs, hyps = ["Ein wohl-bekannter Hund."], ["Ein wohl-bekannter Kater."]
    result = scores(hyps, refs, "de")
    assert result["tokenized_bleu_tokens"] == "moses (de) + compound splitting"
    # Moses splits the full stop and the hyphen is split: "Ein wohl ##AT##-##AT## bekannter Kater ." against the
    # same with "Hund": 5/6 unigrams, 3/5 bigrams, 2/4 trigrams, 1/3 4-grams match, same length (no brevity penalty)
    assert result["tokenized_bleu"] == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    assert result["bleu"] < result["tokenized_bleu"]  # sacreBLEU's 13a keeps "wohl-bekannter" whole


def test_without_sacremoses_no_tokenized_bleu_is_reported_under_the_papers_name(monkeypatch):
    import sys

    from resmlp.seq2seq.scoring import scores

    monkeypatch.setitem(sys.modules, "sacremoses", None)  # import sacremoses -> ImportError
    result = scores(["the cat sat on the mat ."], ["the cat sat on the mat ."], "en")
    assert result["tokenized_bleu"] is None and "pip install 'sacremoses" in result["tokenized_bleu_tokens"]
    assert result["bleu"] == pytest.approx(100.0)


def test_after_the_warm_up_adagrad_holds_its_rate_this_projects_choice_stated_in_the_recipe():
    """Section 3.6 gives "Adagrad with learning rate 0.2, 32k steps of linear warmup" and nothing after; the
    constant rate is this project's choice, stated where the recipe is (fairseq's scaling_nmt: inverse_sqrt)."""
    import torch

    from resmlp.seq2seq import recipes
    from resmlp.seq2seq.config import TranslationConfig
    from resmlp.seq2seq.train import make_optimizer

    cfg = TranslationConfig(output="o", task="numbers-en-de", optimizer="adagrad", lr=0.2, warmup_steps=4)
    opt, sched = make_optimizer(torch.nn.Linear(2, 2), cfg)
    rates = []
    for _ in range(12):
        rates.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert rates[:4] == pytest.approx([0.05, 0.1, 0.15, 0.2]) and rates[4:] == pytest.approx([0.2] * 8)
    assert "this project's choice" in recipes.__doc__ and "inverse_sqrt" in recipes.__doc__


def test_the_budget_line_counts_updates_and_epochs_from_the_batches_and_processes():
    from resmlp.seq2seq.budget import budget_line, updates_per_epoch
    from resmlp.seq2seq.config import TranslationConfig

    # each of 3 processes takes 4,000 // 3 = 1,333 batches, 8 to an update: 167 updates (the last one short)
    assert updates_per_epoch(4000, 3, 8) == 167 and updates_per_epoch(5, 8, 1) == 1
    cfg = TranslationConfig(output="o", task="numbers-en-de", max_tokens=3584, update_freq=1, warmup_steps=32_000,
                            max_steps=100_000)
    line = budget_line(cfg, batches=32_000, world=8, pairs=4_500_000, tokens=120_000_000)
    # 32,000 batches on 8 GPUs, one batch per update: 4,000 updates an epoch
    assert line.startswith("budget: 28,672 tokens per update at most (3584 per batch x 1 batches (--update-freq) x 8 "
                           "processes); this corpus (4,500,000 pairs, 120,000,000 tokens) is 4,000 updates an epoch; "
                           "warm-up 32,000 updates = 8.00 epochs; run 100,000 updates (--max-steps) = 25.00 epochs")
