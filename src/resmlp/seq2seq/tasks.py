"""Built-in CPU-sized translation tasks: English number words to German / French number words.

German writes units before tens ("zweiundvierzig" = two-and-forty) and French counts in twenties
("quatre-vingt-dix-sept"), so copying or monotonic alignment fails. Text comes from `num2words`.

Held-out numbers: valid and test numbers (3 to `max_digits` digits) never appear in training. All numbers
0-99 are always in training: they are the words every larger number is built from.
"""

from __future__ import annotations

import random
from pathlib import Path

from num2words import num2words

from resmlp.fileio import atomic_write

TASKS = {"numbers-en-de": "de", "numbers-en-fr": "fr"}


def _sample_numbers(rng: random.Random, count: int, max_digits: int, taken: set[int]) -> list[int]:
    """`count` distinct numbers not in `taken`, with the digit count uniform in 3..max_digits."""
    out: list[int] = []
    while len(out) < count:
        digits = rng.randint(3, max_digits)
        n = rng.randint(10 ** (digits - 1), 10**digits - 1)
        if n not in taken:
            taken.add(n)
            out.append(n)
    return out


def number_splits(
    train_size: int, valid_size: int, test_size: int, max_digits: int, seed: int
) -> dict[str, list[int]]:
    if max_digits < 3:
        raise ValueError("max_digits must be at least 3 (held-out numbers have 3 or more digits)")
    available = 10**max_digits - 100
    if train_size + valid_size + test_size > available // 2:
        raise ValueError(f"{train_size + valid_size + test_size} numbers requested but only {available} "
                         f"have 3..{max_digits} digits; lower the sizes or raise max_digits")
    rng = random.Random(seed)
    taken: set[int] = set(range(100))
    test = _sample_numbers(rng, test_size, max_digits, taken)
    valid = _sample_numbers(rng, valid_size, max_digits, taken)
    train = list(range(100)) + _sample_numbers(rng, max(0, train_size - 100), max_digits, taken)
    rng.shuffle(train)
    return {"train": train, "valid": valid, "test": test}


def make_number_task(
    name: str,
    out_dir: str | Path,
    train_size: int = 50_000,
    valid_size: int = 500,
    test_size: int = 1000,
    max_digits: int = 6,
    seed: int = 0,
) -> Path:
    """Write {train,valid,test}.{src,tgt} for task `name` under out_dir (src = English); returns out_dir."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    lang = TASKS[name]
    out_dir = Path(out_dir)
    for split, numbers in number_splits(train_size, valid_size, test_size, max_digits, seed).items():
        for suffix, language in (("src", "en"), ("tgt", lang)):
            text = "".join(num2words(n, lang=language) + "\n" for n in numbers)
            atomic_write(out_dir / f"{split}.{suffix}",
                         lambda p, text=text: p.write_text(text, encoding="utf-8"))
    return out_dir
