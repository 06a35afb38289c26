"""Parallel files, tokenizer, batching and the number-words task, bad input included."""

from __future__ import annotations

import pytest
from num2words import num2words

from resmlp.errors import DataError
from resmlp.seq2seq.data import Tokenizer, collate, encode_pairs, read_parallel, token_batches
from resmlp.seq2seq.tasks import make_number_task, number_splits


@pytest.fixture(scope="module")
def tokenizer():
    lines = [num2words(n) for n in range(300)] + [num2words(n, lang="de") for n in range(300)]
    return Tokenizer.train(lines, vocab_size=120)


def write(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


def test_mismatched_line_counts_are_refused(tmp_path):
    src = write(tmp_path / "a.src", ["one", "two", "three"])
    tgt = write(tmp_path / "a.tgt", ["eins", "zwei"])
    with pytest.raises(ValueError, match=r"has 3 lines but .* has 2"):
        read_parallel(src, tgt)


def test_empty_lines_are_refused_with_their_line_numbers(tmp_path):
    src = write(tmp_path / "a.src", ["one", "", "three"])
    tgt = write(tmp_path / "a.tgt", ["eins", "zwei", "drei"])
    with pytest.raises(ValueError, match=r"empty line.*line 2"):
        read_parallel(src, tgt)


def test_non_utf8_file_is_refused(tmp_path):
    (tmp_path / "a.src").write_bytes(b"caf\xe9\n")
    write(tmp_path / "a.tgt", ["x"])
    with pytest.raises(ValueError, match="not UTF-8"):
        read_parallel(tmp_path / "a.src", tmp_path / "a.tgt")


def test_long_lines_are_truncated_with_a_warning(tokenizer):
    long = " ".join(["three hundred"] * 20)
    with pytest.warns(UserWarning, match="1 of 2 .* truncated"):
        ids = tokenizer.encode([long, "seven"], max_tokens=6)
    assert len(ids[0]) == 6 and len(ids[1]) < 6


def test_unknown_characters_become_unk_with_a_warning(tokenizer):
    with pytest.warns(UserWarning, match="unknown to the tokenizer"):
        ids = tokenizer.encode(["five 三百 ☃"], max_tokens=50)
    assert 3 in ids[0]
    assert isinstance(tokenizer.decode(ids)[0], str)


def test_tokenizer_round_trips_and_keeps_special_ids(tokenizer):
    text = "three hundred and forty-two"
    again = Tokenizer(tokenizer.model_bytes)
    assert again.decode(again.encode([text], 50)) == [text]
    assert min(min(x) for x in tokenizer.encode([text], 50)) > 3  # no pad/bos/eos/unk in ordinary text


def test_token_batches_cover_every_pair_once_within_budget():
    src = [3, 10, 4, 25, 7, 7, 2, 60] * 5
    tgt = [4, 9, 5, 20, 8, 6, 3, 10] * 5
    batches = token_batches(src, tgt, max_tokens=64, seed=0)
    assert sorted(i for b in batches for i in b) == list(range(len(src)))
    for b in batches:
        longest = max(max(src[i], tgt[i] + 1) for i in b)
        assert len(b) == 1 or longest * len(b) <= 64
    assert token_batches(src, tgt, 64, seed=0) == batches != token_batches(src, tgt, 64, seed=1)


def test_collate_adds_bos_eos_and_right_padding():
    # sources end with EOS (2) as fairseq's binarised ones (Dictionary.encode_line(append_eos=True)); models saved
    # before that field existed (source_eos False) are fed sources without it
    src, tgt_in, tgt_out = collate([[5, 6, 7], [8]], [[9], [10, 11]])
    assert src.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert tgt_in.tolist() == [[1, 9, 0], [1, 10, 11]]
    assert tgt_out.tolist() == [[9, 2, 0], [10, 11, 2]]
    assert collate([[5, 6, 7], [8]], [[9]] * 2, source_eos=False)[0].tolist() == [[5, 6, 7], [8, 0, 0]]


def test_pairs_over_max_len_are_dropped_not_truncated(tokenizer):
    """As fairseq's training drops pairs over the model's positions (and its WMT preparation keeps 1-250 tokens),
    a pair whose source + EOS or BOS + target passes max_len is left out whole, with a warning giving the count."""
    short, long = "one two three", " ".join(["seven hundred and twelve"] * 8)
    n_short = len(tokenizer.encode([short], None)[0])
    with pytest.warns(UserWarning, match="1 of 3 train pairs .* dropped"):
        src, tgt = encode_pairs(tokenizer, [short, long, short], [short, short, short], n_short + 1, True, "train")
    assert src == tgt == tokenizer.encode([short, short], None)  # whole, never cut
    with pytest.warns(UserWarning, match="dropped"):  # the source fits but BOS + target does not
        assert encode_pairs(tokenizer, [short, short], [short, long], n_short + 1, True, "train")[0] == src[:1]
    with pytest.raises(DataError, match="raise --max-len"):
        encode_pairs(tokenizer, [long], [long], n_short + 1, True, "train")


def test_number_task_holds_out_test_numbers(tmp_path):
    splits = number_splits(train_size=3000, valid_size=100, test_size=200, max_digits=5, seed=0)
    train = set(splits["train"])
    assert set(range(100)) <= train
    assert not train & set(splits["test"]) and not train & set(splits["valid"])
    assert not set(splits["test"]) & set(splits["valid"])
    assert all(100 <= n < 100_000 for n in splits["test"])
    with pytest.raises(ValueError, match="max_digits"):
        number_splits(10, 1, 1, max_digits=2, seed=0)


def test_number_task_files_are_aligned_german_reorders(tmp_path):
    make_number_task("numbers-en-de", tmp_path, train_size=300, valid_size=10, test_size=20, max_digits=4)
    src, tgt = read_parallel(tmp_path / "train.src", tmp_path / "train.tgt")
    pairs = dict(zip(src, tgt, strict=True))
    assert pairs["forty-two"] == "zweiundvierzig"  # units before tens
    assert len(read_parallel(tmp_path / "test.src", tmp_path / "test.tgt")[0]) == 20
    with pytest.raises(ValueError, match="unknown task"):
        make_number_task("numbers-en-xx", tmp_path)


@pytest.mark.parametrize("source_eos", [True, False])
def test_decoding_feeds_sources_as_the_model_was_trained(tokenizer, source_eos):
    """translate() ends each source with EOS for a model trained so (today's), without for one of an earlier
    version (source_eos False in its config), as training's collate did."""
    import torch

    from resmlp.seq2seq.model import build_translation_model, translation_model_config
    from resmlp.seq2seq.train import translate

    model = build_translation_model(translation_model_config("tiny", len(tokenizer), source_eos=source_eos))
    seen = []
    encode = model.encode
    model.encode = lambda src: seen.append(src.clone()) or encode(src)
    translate(model, tokenizer, ["seven", "one hundred and two"], beam=1)
    ids = tokenizer.encode(["seven", "one hundred and two"], None)
    expected = [row + [2] * source_eos for row in ids]
    assert sorted([t for t in row if t != 0] for row in torch.cat(seen).tolist()) == sorted(expected)
