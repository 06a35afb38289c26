"""Translation scores: sacreBLEU's BLEU and chrF on detokenised text, exact match, and the paper's tokenized BLEU.

Table 5 reports "tokenized BLEU on newstest2014", following Ott et al.: fairseq's scripts/compound_split_bleu.sh
scores Moses-tokenised hypotheses and references with every hyphen between two non-spaces split as
" ##AT##-##AT## " (perl `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`), BLEU over whitespace tokens. Here the Moses
tokenizer is `sacremoses` (installed by the README's set-up, requirements.lock; pyproject's `translate` extra). A
setup without it gets no tokenized BLEU (null, and `tokenized_bleu_tokens` says how to install it) rather than a
number under the paper's name that another tokenizer produced. An install that is there but fails to load is
refused (errors.InstallError, one line saying how to reinstall), not taken for a missing one: the scores would
lose their tokenized BLEU without a word.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sacrebleu

from resmlp.errors import InstallError

_COMPOUND = re.compile(r"(\S)-(\S)")
MISSING_MOSES = ("not computed: sacremoses (the Moses tokenizer) is not installed; install it with "
                 "pip install 'sacremoses>=0.2' (the README's set-up does)")


def moses_tokenizer(lang: str = "en") -> Callable[[str], str] | None:
    """The Moses tokenizer of `lang` (sacremoses' port of tokenizer.perl -l LANG; hyphens are left whole for
    `compound_split`), or None where sacremoses is not installed. InstallError where it is installed but broken."""
    try:
        from sacremoses import MosesTokenizer

        moses = MosesTokenizer(lang=lang)
    except ModuleNotFoundError as e:
        if e.name != "sacremoses":  # one of its own dependencies is missing: broken, not absent
            raise _broken_sacremoses(e) from None
        return None
    except Exception as e:  # a damaged install raises whatever its code raises: SyntaxError, AttributeError...
        raise _broken_sacremoses(e) from None

    def tokenize(text: str) -> str:
        # a damaged or substituted install may return None or a list, or raise: one line, not a traceback from
        # compound_split or sacrebleu far from the cause
        try:
            tokens = moses.tokenize(text, return_str=True, escape=False)
        except Exception as e:  # noqa: BLE001 - whatever the damaged code raises
            raise _broken_sacremoses(e) from None
        if not isinstance(tokens, str):
            raise _broken_sacremoses(TypeError(f"its tokenizer returned {type(tokens).__name__}, not text"))
        return tokens

    tokenize("a-b, c.")  # at load: a broken tokenizer is refused before any work, as a broken import is
    return tokenize


def _broken_sacremoses(e: Exception) -> InstallError:
    reason = (str(e).splitlines() or [""])[0][:200]
    return InstallError(f"sacremoses (the Moses tokenizer of the paper's tokenized BLEU) is installed but fails to "
                        f"load ({type(e).__name__}: {reason}); reinstall it: pip install --force-reinstall sacremoses")


def compound_split(text: str) -> str:
    """Hyphens between two non-spaces split as fairseq's compound_split_bleu.sh does (Python's re.sub, like
    perl's s///g, does not overlap matches: "a-b-c" keeps its second hyphen, as there)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def tokenized_bleu(hyps: list[str], refs: list[str], lang: str = "en") -> float | None:
    """The paper's Table 5 measure on detokenised text (None without sacremoses): Moses tokens, compound
    splitting, BLEU over whitespace tokens. Not comparable with sacreBLEU."""
    tokenize = moses_tokenizer(lang)
    if tokenize is None:
        return None
    bleu = sacrebleu.BLEU(tokenize="none", force=True)
    split_hyps = [compound_split(tokenize(h)) for h in hyps]
    split_refs = [compound_split(tokenize(r)) for r in refs]
    return bleu.corpus_score(split_hyps, [split_refs]).score


def scores(hyps: list[str], refs: list[str], lang: str = "en") -> dict[str, Any]:
    """sacreBLEU BLEU and chrF on detokenised text with sacreBLEU's signature, exact match (%), and
    tokenized_bleu (the paper's measure, see the module) with the tokens it used."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    paper = tokenized_bleu(hyps, refs, lang)
    exact = 100.0 * sum(h.strip() == r.strip() for h, r in zip(hyps, refs, strict=True)) / max(1, len(refs))
    return {"bleu": bleu.corpus_score(hyps, [refs]).score, "chrf": chrf.corpus_score(hyps, [refs]).score,
            "exact_match": exact, "tokenized_bleu": paper,
            "tokenized_bleu_tokens": f"moses ({lang}) + compound splitting" if paper is not None else MISSING_MOSES,
            "bleu_signature": str(bleu.get_signature())}
