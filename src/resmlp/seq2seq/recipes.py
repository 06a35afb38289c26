"""The paper's WMT14 translation setup (section 3.6) as `resmlp translate train --recipe` presets.

Each value is a flag of `resmlp translate train` and names its source:
- "paper 3.6": "We use Adagrad with learning rate 0.2, 32k steps of linear warmup, label smoothing 0.1,
  dropout rate 0.15 for En-De and 0.1 for En-Fr. We initialize the LayerScale parameter to 0.2. We generate
  translations with the beam search algorithm, with a beam of size 4." Models "of dimension 512, with a
  hidden MLP size of 2,048, and with 6 or 12 layers" (the `base6` / `base12` presets).
- "Ott et al.": the setup the paper follows ([45], Scaling Neural Machine Translation): a joint BPE
  vocabulary of 32K symbols for En-De and 40K for En-Fr, and fairseq's examples/scaling_nmt/README.md, which
  trains with `--max-tokens 3584` per GPU and `--warmup-updates 4000`, on a machine of 8 GPUs as its big-batch
  note assumes (TOKENS_PER_UPDATE: 3,584 x 8 = 28,672 tokens per update), and decodes newstest2014 with
  `--beam 4 --lenpen 0.6` (the length penalty is not in the paper).
- "fairseq transformer": fairseq/models/transformer base_architecture, where `dropout` acts on embeddings and
  sublayer outputs and `attention_dropout` / `activation_dropout` default to 0.0.
- "Vaswani et al.": "for the base models, we used a single model obtained by averaging the last 5 checkpoints"
  (section 6.1), the averaging fairseq's scripts/average_checkpoints.py does; "We trained the base models for a
  total of 100,000 steps" (section 5.2) of batches of "approximately 25000 source tokens and 25000 target tokens"
  (5.1): the number of updates of the paper's baseline (Table 5; section 3.6: "our 6-layer model is more
  comparable to the base transformer model from Vaswani et al."), at a batch about the size
  of ours (`--max-tokens` counts the longer side of each pair, padded). It is the default of `--max-steps`
  (not a recipe value, so that `--max-steps` may be given anywhere on the command line).

The batch is this project's choice, because section 3.6 states none. Ott et al.'s README pairs its warm-up of
4,000 updates with two batches: 28,672 tokens (8 GPUs) and 458,752 (`--update-freq 16`, "to simulate training
on 8*16=128 GPUs"). The paper's 32k warm-up updates, its only stated count, at 458,752 tokens would pass 14.7 B
tokens before the peak rate, over 3,000 for each of WMT14 En-De's ~4.5 M pairs (pairs of tens of tokens: of
the order of 100 epochs); at 28,672 tokens they pass 0.92 B, and the whole run of 100,000 updates 2.87 B: a
Transformer-base budget (Vaswani et al.'s 100,000 steps of ~25,000 + 25,000 tokens), on one machine of 8 GPUs,
as the paper's image models were trained ("eight V100-32GB GPUs", section 3.1).

`--update-freq` is not a recipe value: `resmlp translate train` derives it from the number of processes
(WORLD_SIZE) and `--max-tokens` so that an update holds TOKENS_PER_UPDATE tokens at most (1 on 8 processes, 8 on
one), and every run prints its budget when it starts (seq2seq/budget.py): tokens per update, warm-up and total
in updates and in epochs of its corpus. The schedule
after the warm-up (constant) is this project's choice: section 3.6 gives only the warm-up, fairseq's scaling_nmt
decays as inverse_sqrt (with Adam, not the paper's Adagrad).

No torch import: the command line reads this module to build its parser.
"""

from __future__ import annotations

from typing import Any

PAPER, OTT, FAIRSEQ, VASWANI = "paper 3.6", "Ott et al.", "fairseq transformer", "Vaswani et al."
# Ott et al.'s batch on one machine: 3,584 tokens per GPU x 8 GPUs (fairseq's scaling_nmt README, without the
# --update-freq 16 of its 128-GPU simulation); this project's choice of the two, see the docstring
TOKENS_PER_UPDATE: tuple[int, str] = (3584 * 8, "this project's choice: Ott et al.'s --max-tokens 3584 x 8 GPUs; "
                                                "the paper states no batch")

# recipe -> flag (argparse dest) -> (value, source)
RECIPES: dict[str, dict[str, tuple[Any, str]]] = {
    "wmt14-en-de": {
        "preset": ("base6", PAPER),  # dim 512, hidden 2048, 6 layers; base12 for ResMLP-12
        "optimizer": ("adagrad", PAPER),
        "lr": (0.2, PAPER),
        "warmup_steps": (32_000, PAPER),
        "label_smoothing": (0.1, PAPER),
        "dropout": (0.15, PAPER),
        "attention_dropout": (0.0, FAIRSEQ),
        "activation_dropout": (0.0, FAIRSEQ),
        "layerscale_init": (0.2, PAPER),
        "beam": (4, PAPER),
        "lenpen": (0.6, OTT),
        "vocab_size": (32_000, OTT),
        "max_tokens": (3584, OTT),
        "average_last": (5, VASWANI),
        "max_minutes": (7 * 24 * 60.0, "a week: the paper gives no time budget (the default 20 min is a demo's)"),
    },
}
RECIPES["wmt14-en-fr"] = {**RECIPES["wmt14-en-de"], "dropout": (0.1, PAPER), "vocab_size": (40_000, OTT)}


def recipe_values(name: str) -> dict[str, Any]:
    """The flag values of recipe `name`, without their sources."""
    return {flag: value for flag, (value, _) in RECIPES[name].items()}
