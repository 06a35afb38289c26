"""Parallel text files, the sentencepiece tokenizer, token-based batching.

Bad input, and what happens to it:
- source and target files with different line counts: ValueError naming both files and counts;
- an empty line (either side) in training/evaluation files: ValueError with the line numbers; a line of only
  spaces and invisible characters (zero-width space U+200B, byte order mark U+FEFF, other format or control
  characters, Hangul fillers: `is_blank`) is empty too; an empty line given to ``decode`` is translated to an
  empty line without running the model;
- a byte order mark (U+FEFF) at the start of any file or of stdin (sources, targets, `eval --ref` references):
  dropped, as Python's utf-8-sig codec does; else it would stay in the first sentence (and its score);
- a training or validation pair longer than the model's max_len (in subword tokens, the source with its EOS, the
  target with BOS or EOS): dropped, with a warning saying how many, as fairseq drops them (its training batches
  skip pairs over the model's positions; its WMT preparation keeps pairs of 1 to 250 tokens); a source given to
  ``decode`` or a test split is truncated to fit instead, with a warning (every test sentence must be scored);
- characters the tokenizer never saw: sentencepiece maps them to <unk> (id 3), with a warning count;
- a file that is not UTF-8: ValueError naming the file;
- a file without a single sentence pair (empty): DataError naming the file;
- a form feed, vertical tab, U+0085, U+2028 or other separator inside a line: part of that line. Lines end at
  "\n" only (a "\r" before it is dropped), so a character one file happens to hold can't shift every later
  pair (str.splitlines would split there);
- a "\r" not followed by "\n" (old Mac line ends, or a stray one): DataError naming the file and line, with the
  `tr` command that converts it; read as a "\n" it could shift pairs, read as text it would make a corpus of
  carriage-return lines one sentence;
- a tokenizer.model that is truncated, random or of another format, or over TOKENIZER_MAX_BYTES: DataError.
"""

from __future__ import annotations

import io
import random
import shlex
import unicodedata
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm
import torch

from resmlp.errors import DataError

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPLITS = ("train", "valid", "test")
# a joint vocabulary of a million pieces is a few tens of MB; anything larger is not a tokenizer of ours
TOKENIZER_MAX_BYTES = 256 << 20


# the letters that show nothing (Unicode's default-ignorable Hangul fillers); format (Cf: U+200B, U+FEFF, U+2060,
# soft hyphen...) and control (Cc) characters are found by category
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")


def is_blank(line: str) -> bool:
    """True for a line with nothing to translate: only spaces and characters that show nothing."""
    return all(c.isspace() or c in _INVISIBLE_LETTERS or unicodedata.category(c) in ("Cf", "Cc") for c in line)


def split_lines(text: str, name: str = "stdin") -> list[str]:
    """Lines ended by "\n" only (with a "\r" before it dropped), the way parallel corpora are aligned; the
    last line needs no "\n". A leading byte order mark is dropped; a "\r" elsewhere is refused (`name` is
    the file in the message)."""
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    lone = next((i for i, line in enumerate(lines) if "\r" in line), None)
    if lone is not None:
        convert = "tr '\\r' '\\n'" + ("" if name == "stdin" else f" < {shlex.quote(name)} > {shlex.quote(name)}.lf")
        raise DataError(f"{name} line {lone + 1} holds a carriage return (\\r) that does not end a line; lines end "
                        f"with \\n (if it has old Mac line ends, convert it: {convert})")
    return lines


def read_lines(path: str | Path) -> list[str]:
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO or device would block or never end
        raise DataError(f"{path} is not a regular file (expected one sentence per line)")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (expected one sentence per line)")
    try:
        text = path.read_bytes().decode("utf-8")  # not read_text: it turns a lone "\r" into "\n"
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e}); convert it, e.g. with iconv -t utf-8") from None
    return split_lines(text, str(path))


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Aligned source/target lines; refuses empty files, mismatched counts and empty lines with a clear message."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not lines:
            raise DataError(f"{path} is empty; a parallel corpus needs at least one sentence pair (a sentence "
                            "per line)")
    if len(src) != len(tgt):
        raise ValueError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; parallel files must be aligned "
            "line by line (one sentence pair per line)"
        )
    empty = [i + 1 for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if is_blank(s) or is_blank(t)]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (" ..." if len(empty) > 10 else "")
        raise ValueError(
            f"{len(empty)} empty line(s) in {src_path} / {tgt_path} (line {shown}); remove those pairs from "
            "both files, e.g. paste a b | awk -F'\\t' '$1!=\"\" && $2!=\"\"'"
        )
    return src, tgt


def split_paths(data_dir: str | Path, split: str, src_suffix: str, tgt_suffix: str) -> tuple[Path, Path]:
    data_dir = Path(data_dir)
    return data_dir / f"{split}.{src_suffix}", data_dir / f"{split}.{tgt_suffix}"


class Tokenizer:
    """A sentencepiece model shared by source and target (joint vocabulary), kept as its bytes."""

    def __init__(self, model_bytes: bytes, name: str = "tokenizer") -> None:
        self.model_bytes = model_bytes
        self.sp = spm.SentencePieceProcessor()
        try:  # sentencepiece parses the protobuf; a damaged one is a RuntimeError("INTERNAL: ...")
            self.sp.LoadFromSerializedProto(model_bytes)
        except RuntimeError:
            raise DataError(f"{name} is not a sentencepiece model (truncated, or another format); use the "
                            "tokenizer.model that `resmlp translate train` wrote with the checkpoint") from None
        if (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id()) != (PAD, BOS, EOS, UNK):
            raise DataError(f"{name} was not trained by resmlp (expected pad/bos/eos/unk ids 0/1/2/3)")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, seed_sentences: int = 2_000_000) -> Tokenizer:
        """Train a unigram sentencepiece model in memory (the vocabulary may end smaller if text is small)."""
        buf = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size, model_type="unigram",
                character_coverage=1.0, pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK,
                hard_vocab_limit=False, input_sentence_size=seed_sentences, shuffle_input_sentence=True,
                minloglevel=2,
            )
        except RuntimeError as e:  # e.g. "Vocabulary size is smaller than required_chars. 8 vs 12."
            reason = str(e).split("]", 1)[-1].strip() or str(e)
            raise DataError(f"the tokenizer could not be trained with --vocab-size {vocab_size}: {reason[:200]} "
                            "(every distinct character of the training text needs a piece: raise --vocab-size)"
                            ) from None
        return cls(buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer {path} does not exist; `resmlp translate train` writes it")
        if path.stat().st_size > TOKENIZER_MAX_BYTES:
            raise DataError(f"{path} holds {path.stat().st_size} bytes, more than any tokenizer of this project "
                            f"({TOKENIZER_MAX_BYTES >> 20} MiB); it is not the run's tokenizer.model")
        return cls(path.read_bytes(), str(path))

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, lines: list[str], max_tokens: int | None, what: str = "lines") -> list[list[int]]:
        """Token ids per line, cut to max_tokens (None: whole); warns how many lines were cut or had unknown
        characters."""
        ids = self.sp.encode(lines)
        cut = 0 if max_tokens is None else sum(len(x) > max_tokens for x in ids)
        unknown = sum(UNK in x for x in ids)
        if cut:
            warnings.warn(f"{cut} of {len(ids)} {what} longer than {max_tokens} tokens were truncated "
                          "(raise the model's max_len to keep them whole)", stacklevel=2)
        if unknown:
            warnings.warn(f"{unknown} of {len(ids)} {what} contain characters unknown to the tokenizer; "
                          "they are read as <unk>", stacklevel=2)
        return ids if max_tokens is None else [x[:max_tokens] for x in ids]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode(ids)


def token_batches(
    src_lens: list[int], tgt_lens: list[int], max_tokens: int, seed: int
) -> list[list[int]]:
    """Indices grouped by similar length so each batch holds about max_tokens (padded) tokens, in a
    shuffled order (seeded). A pair longer than max_tokens gets a batch of its own."""
    order = sorted(range(len(src_lens)), key=lambda i: (src_lens[i], tgt_lens[i]))
    batches, current, longest = [], [], 0
    for i in order:
        size = max(src_lens[i], tgt_lens[i] + 1)
        if current and max(longest, size) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def pad_batch(seqs: list[list[int]], prefix: Sequence[int] = (), suffix: Sequence[int] = ()) -> torch.Tensor:
    rows = [list(prefix) + s + list(suffix) for s in seqs]
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def encode_pairs(tok: Tokenizer, src: list[str], tgt: list[str], max_len: int, source_eos: bool, what: str
                 ) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of the pairs that fit a model of `max_len` positions: the source with its EOS (`source_eos`), the
    target with BOS (decoder input) or EOS (output). Longer pairs are dropped, not cut (a cut target teaches the
    model to stop mid-sentence), with a warning giving the count."""
    src_ids, tgt_ids = tok.encode(src, None, f"{what} sources"), tok.encode(tgt, None, f"{what} targets")
    fits = [i for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True))
            if len(s) + source_eos <= max_len and len(t) + 1 <= max_len]
    if not fits:
        raise DataError(f"every {what} pair is longer than the model's max_len {max_len} tokens; raise --max-len")
    if len(fits) < len(src_ids):
        warnings.warn(f"{len(src_ids) - len(fits)} of {len(src_ids)} {what} pairs are longer than the model's "
                      f"max_len {max_len} tokens and were dropped (raise --max-len to keep them)", stacklevel=2)
    return [src_ids[i] for i in fits], [tgt_ids[i] for i in fits]


def source_batch(src: list[list[int]], source_eos: bool = True) -> torch.Tensor:
    """Sources right-padded with PAD, each ended by EOS when the model was trained so (fairseq's binarised sources
    end with EOS)."""
    return pad_batch(src, suffix=[EOS] if source_eos else [])


def collate(src: list[list[int]], tgt: list[list[int]], source_eos: bool = True
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source [+ EOS], decoder input = BOS + target, decoder output = target + EOS), right-padded with PAD."""
    return source_batch(src, source_eos), pad_batch(tgt, prefix=[BOS]), pad_batch(tgt, suffix=[EOS])
