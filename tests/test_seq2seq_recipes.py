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
# Ott et al. (the setup the paper follows): joint BPE of 32K (En-De) / 40K (En-Fr); fairseq's scaling_nmt decoding
OTT = {"wmt14-en-de": {"vocab_size": 32_000, "lenpen": 0.6}, "wmt14-en-fr": {"vocab_size": 40_000, "lenpen": 0.6}}


def _train_args(*flags: str):
    return build_parser().parse_args(["translate", "train", "--data", "D", "--output", "O", *flags])


@pytest.mark.parametrize("recipe", sorted(DROPOUT))
def test_recipe_sets_the_papers_values_with_their_sources(recipe):
    args = _train_args("--recipe", recipe)
    expected = {**PAPER, "dropout": DROPOUT[recipe], **OTT[recipe]}
    assert {k: getattr(args, k) for k in expected} == expected
    sources = {k: source for k, (_, source) in RECIPES[recipe].items()}
    assert all(sources[k] == "paper 3.6" for k in (*PAPER, "dropout"))
    assert sources["lenpen"] == sources["vocab_size"] == "Ott et al."


def test_flags_after_the_recipe_override_it_and_flags_before_it_are_refused(capsys):
    assert _train_args("--recipe", "wmt14-en-de", "--dropout", "0.3", "--preset", "base12").dropout == 0.3
    with pytest.raises(SystemExit) as e:
        _train_args("--warmup-steps", "100", "--recipe", "wmt14-en-de")
    assert e.value.code == 2 and "--warmup-steps came before --recipe wmt14-en-de" in capsys.readouterr().err


def test_without_recipe_the_defaults_stay():
    args = _train_args()
    assert args.warmup_steps == 500 and args.dropout is None and args.recipe is None


def test_the_recipe_model_is_the_papers():
    from resmlp.seq2seq.model import translation_model_config

    args = _train_args("--recipe", "wmt14-en-de")
    cfg = translation_model_config(args.preset, 32_000, dropout=args.dropout, layerscale_init=args.layerscale_init)
    assert (cfg.dim, cfg.hidden, cfg.encoder_layers, cfg.decoder_layers) == (512, 2048, 6, 6)
    assert cfg.dropout == 0.15 and cfg.layerscale_init == 0.2


def test_tokenized_bleu_names_its_tokenizer_and_uses_moses_where_installed(monkeypatch):
    import sys
    import types

    from resmlp.seq2seq.train import scores

    refs, hyps = ["a well-known cat ."], ["a well-known dog ."]
    fallback = scores(hyps, refs, "de")
    assert fallback["tokenized_bleu_tokens"].startswith("13a") and "nrefs:1" in fallback["bleu_signature"]
    seen = []

    class FakeMoses:  # stands in for sacremoses.MosesTokenizer: records the language, splits on spaces
        def __init__(self, lang):
            seen.append(lang)

        def tokenize(self, text, return_str, escape):
            assert return_str and not escape
            return text

    monkeypatch.setitem(sys.modules, "sacremoses", types.SimpleNamespace(MosesTokenizer=FakeMoses))
    moses = scores(hyps, refs, "de")
    assert moses["tokenized_bleu_tokens"] == "moses" and seen == ["de"]
