"""The one rule that turns a measured effect and the paper's into a verdict (ablations.py and claims.py use it).

A measured effect is a delta (a row's mean minus its reference's mean, in points of top-1, or a ratio's
distance from 1) with a noise: the half-range over seeds of the row plus that of its reference. The rule:

- **one run**: a side has a single run, so there is no spread and no verdict;
- for a claim that something has **no effect** (paper delta 0): **consistent** when |delta| <= noise,
  **contradicted** otherwise;
- **the scale cannot tell**: the noise is at least the paper's |delta| and the paper's delta lies within
  delta ± noise: any outcome this noisy would agree with the paper, so agreement says nothing (e.g. the
  depth-wise conv row: -9.99 ± 9.83 against the paper's -0.3);
- **within the noise**: |delta| <= noise (the sign is not resolved);
- **contradicted**: the sign is opposite to the paper's and |delta| > noise;
- **reproduced**: the paper's sign, |delta| > noise, and the paper's delta lies within delta ± noise;
- **same sign, different size**: the paper's sign, |delta| > noise, the paper's delta outside delta ± noise.

Exact counts (parameters, operations) have no noise: **reproduced (exact)** when they match the claim,
**contradicted (exact)** otherwise.
"""

from __future__ import annotations

import statistics

RULE = __doc__.split("\n\n", 1)[1].strip()


def half_range(values: list[float]) -> float | None:
    """Half the range of a row's runs; None for one run."""
    return (max(values) - min(values)) / 2 if len(values) > 1 else None


def effect(row: list[float], reference: list[float]) -> tuple[float, float | None]:
    """(delta of the means, noise: the two half-ranges summed; None if either side has one run)."""
    delta = statistics.mean(row) - statistics.mean(reference)
    spreads = (half_range(row), half_range(reference))
    return delta, None if None in spreads else sum(spreads)  # type: ignore[arg-type]


def verdict(delta: float, noise: float | None, paper_delta: float) -> str:
    """The rule of this module's docstring."""
    if noise is None:
        return "one run"
    if paper_delta == 0:
        return "consistent" if abs(delta) <= noise else "contradicted"
    if abs(paper_delta) <= noise and abs(paper_delta - delta) <= noise:
        return "the scale cannot tell"
    if abs(delta) <= noise:
        return "within the noise"
    if (delta > 0) != (paper_delta > 0):
        return "contradicted"
    return "reproduced" if abs(paper_delta - delta) <= noise else "same sign, different size"


def exact_verdict(holds: bool) -> str:
    return "reproduced (exact)" if holds else "contradicted (exact)"
