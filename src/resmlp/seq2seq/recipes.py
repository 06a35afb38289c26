"""The paper's WMT14 translation setup (section 3.6) as `resmlp translate train --recipe` presets.

Each value is a flag of `resmlp translate train` and names its source:
- "paper 3.6": "We use Adagrad with learning rate 0.2, 32k steps of linear warmup, label smoothing 0.1,
  dropout rate 0.15 for En-De and 0.1 for En-Fr. We initialize the LayerScale parameter to 0.2. We generate
  translations with the beam search algorithm, with a beam of size 4." Models "of dimension 512, with a
  hidden MLP size of 2,048, and with 6 or 12 layers" (the `base6` / `base12` presets).
- "Ott et al.": the setup the paper follows ([45], Scaling Neural Machine Translation): a joint BPE
  vocabulary of 32K symbols for En-De and 40K for En-Fr, and fairseq's examples/scaling_nmt/README.md,
  which decodes newstest2014 with `--beam 4 --lenpen 0.6` (the length penalty is not in the paper).
Not set, because neither source fixes it for this code: the batch (Ott et al. trained on many GPUs with large
token batches: `--max-tokens` is per process here) and the number of steps.

No torch import: the command line reads this module to build its parser.
"""

from __future__ import annotations

from typing import Any

PAPER, OTT = "paper 3.6", "Ott et al."

# recipe -> flag (argparse dest) -> (value, source)
RECIPES: dict[str, dict[str, tuple[Any, str]]] = {
    "wmt14-en-de": {
        "preset": ("base6", PAPER),  # dim 512, hidden 2048, 6 layers; base12 for ResMLP-12
        "optimizer": ("adagrad", PAPER),
        "lr": (0.2, PAPER),
        "warmup_steps": (32_000, PAPER),
        "label_smoothing": (0.1, PAPER),
        "dropout": (0.15, PAPER),
        "layerscale_init": (0.2, PAPER),
        "beam": (4, PAPER),
        "lenpen": (0.6, OTT),
        "vocab_size": (32_000, OTT),
        "max_minutes": (7 * 24 * 60.0, "a week: the paper gives no time budget (the default 20 min is a demo's)"),
    },
}
RECIPES["wmt14-en-fr"] = {**RECIPES["wmt14-en-de"], "dropout": (0.1, PAPER), "vocab_size": (40_000, OTT)}


def recipe_values(name: str) -> dict[str, Any]:
    """The flag values of recipe `name`, without their sources."""
    return {flag: value for flag, (value, _) in RECIPES[name].items()}
