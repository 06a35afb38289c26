"""Gradient accumulation (`--update-freq`), its resume contract, and checkpoint averaging (`--average-last`,
`resmlp translate average`) of `resmlp translate train`, on a tiny corpus in one process."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
import torch
from num2words import num2words

from resmlp.cli import main
from resmlp.runtime import DistInfo
from resmlp.seq2seq import train as seq2seq_train
from resmlp.seq2seq.averaging import average_state_dicts, kept_checkpoints
from resmlp.seq2seq.data import collate
from resmlp.seq2seq.model import build_translation_model, translation_model_config
from resmlp.seq2seq.train import CHECKPOINT, TranslationConfig, train_translation


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for split, numbers in {"train": range(0, 300), "valid": range(400, 410), "test": range(420, 430)}.items():
        (root / f"{split}.en").write_text("".join(num2words(n) + "\n" for n in numbers), encoding="utf-8")
        (root / f"{split}.fr").write_text("".join(num2words(n, lang="fr") + "\n" for n in numbers), encoding="utf-8")
    return root


def _config(corpus, out, **kw) -> TranslationConfig:
    values = dict(output=str(out), data=str(corpus), src_suffix="en", tgt_suffix="fr", preset="tiny",
                  model_overrides={"max_len": 24, "dropout": 0.1}, vocab_size=120, max_tokens=256, optimizer="adam",
                  lr=3e-3, warmup_steps=2, max_steps=8, eval_every=2, log_every=1, beam=1, threads=1, device="cpu",
                  progress=False)
    return TranslationConfig(**{**values, **kw})


def _weights(run) -> dict[str, torch.Tensor]:
    return torch.load(run / CHECKPOINT, weights_only=True)["model"]


def test_an_accumulated_update_is_the_per_token_mean_of_its_batches():
    """Two batches with different token counts give the gradient of one batch holding both (fairseq: the summed
    loss over the accumulated batches divided by their tokens), not the mean of the two batch means."""
    torch.manual_seed(0)
    model = build_translation_model(translation_model_config("tiny", 30, max_len=12, dropout=0.0))
    src = torch.randint(3, 30, (4, 6)).tolist()
    tgt = [[5, 6, 7, 8, 9], [5, 6], [7, 8, 9, 10, 11], [12, 13, 14, 15, 16]]  # 3 and 12 target tokens + EOS each
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1, reduction="sum")
    info = DistInfo(world_size=1, rank=0, local_rank=0, device=torch.device("cpu"))

    def gradients(groups):
        model.zero_grad(set_to_none=True)
        loss, tokens = seq2seq_train._accumulate(model, groups, loss_fn, None, info.device, "none", info)
        return loss, tokens, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    split_loss, split_tokens, split = gradients([collate(src[:2], tgt[:2]), collate(src[2:], tgt[2:])])
    whole_loss, whole_tokens, whole = gradients([collate(src, tgt)])
    assert split_tokens == whole_tokens == 6 + 3 + 6 + 6
    assert split_loss.item() == pytest.approx(whole_loss.item(), rel=1e-6)
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-5, atol=1e-7)


def test_update_freq_is_range_checked_like_every_option(tmp_path, capsys):
    for bad in ("0", "1025"):
        assert main(["translate", "train", "--task", "numbers-en-de", "--update-freq", bad, "--output",
                     str(tmp_path / "r")]) == 2
        assert "--update-freq" in capsys.readouterr().err
    with pytest.raises(Exception, match="--average-last"):
        TranslationConfig(output="o", task="numbers-en-de", average_last=0)


def test_a_run_with_accumulation_resumes_bit_identically(corpus, tmp_path, monkeypatch):
    """Contract: checkpoints are written between updates only. A run stopped at an update boundary, or killed in
    the middle of an update (its first batches' gradients already summed), resumes from its last checkpoint and
    ends with the weights of the run that went straight through, bit for bit."""
    straight = tmp_path / "straight"
    train_translation(_config(corpus, straight, update_freq=3))

    stopped = tmp_path / "stopped"  # stopped after update 2 (mid-epoch), then extended to 8
    train_translation(_config(corpus, stopped, update_freq=3, max_steps=2))
    assert torch.load(stopped / CHECKPOINT, weights_only=True)["batch_in_epoch"] == 6  # 2 updates x 3 batches
    train_translation(_config(corpus, stopped, update_freq=3), resume=True)

    killed = tmp_path / "killed"  # killed at the second batch of update 5: checkpoint of update 4 on disk
    updates, batches = {"done": 0}, {"in_update": 0}
    step, accumulate = seq2seq_train._optimizer_step, seq2seq_train._accumulate

    def counting_step(*args, **kwargs):
        updates["done"] += 1
        batches["in_update"] = 0
        return step(*args, **kwargs)

    def killing_forward(module, inputs):
        if module.training:
            batches["in_update"] += 1
            if updates["done"] == 4 and batches["in_update"] == 2:
                raise KeyboardInterrupt("killed mid-update")

    def watched_accumulate(net, *args, **kwargs):
        handle = net.register_forward_pre_hook(killing_forward)
        try:
            return accumulate(net, *args, **kwargs)
        finally:
            handle.remove()

    with monkeypatch.context() as patch:
        patch.setattr(seq2seq_train, "_optimizer_step", counting_step)
        patch.setattr(seq2seq_train, "_accumulate", watched_accumulate)
        with pytest.raises(KeyboardInterrupt, match="mid-update"):
            train_translation(_config(corpus, killed, update_freq=3))
    assert torch.load(killed / CHECKPOINT, weights_only=True)["step"] == 4
    train_translation(_config(corpus, killed, update_freq=3), resume=True)

    reference = _weights(straight)
    for run in (stopped, killed):
        assert torch.load(run / CHECKPOINT, weights_only=True)["step"] == 8
        weights = _weights(run)
        for key in reference:
            assert torch.equal(weights[key], reference[key]), f"{run.name}: {key} differs after the resume"
    one_batch = tmp_path / "one-batch"  # and accumulation changes the run (it is not ignored)
    train_translation(_config(corpus, one_batch, update_freq=1))
    assert not all(torch.equal(_weights(one_batch)[k], reference[k]) for k in reference)
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["update_freq"] == 3 and summary["max_tokens_per_update"] == 3 * 256


def test_the_run_keeps_its_last_n_checkpoints_and_scores_their_mean(corpus, tmp_path, capsys):
    """--average-last 3, a checkpoint every 2 of 8 steps: checkpoints 4, 6, 8 are kept (2 deleted: bounded disk), the
    test split is decoded with their parameter mean (fairseq's average_checkpoints.py), written as
    checkpoint_avg3.pt; `resmlp translate average` writes the same mean."""
    run = tmp_path / "run"
    summary = train_translation(_config(corpus, run, average_last=3))
    assert [step for step, _ in kept_checkpoints(run)] == [4, 6, 8] and summary["averaged_steps"] == [4, 6, 8]
    kept = [torch.load(path, weights_only=True)["model"] for _, path in kept_checkpoints(run)]
    averaged = torch.load(run / "checkpoint_avg3.pt", weights_only=True)
    assert averaged["averaged_steps"] == [4, 6, 8]
    for key in kept[0]:
        torch.testing.assert_close(averaged["model"][key], torch.stack([k[key] for k in kept]).mean(0),
                                   rtol=1e-6, atol=1e-7)
    assert all(torch.equal(kept[-1][k], _weights(run)[k]) for k in kept[-1])  # the last kept: the final weights
    assert any(not torch.equal(averaged["model"][k], kept[-1][k]) for k in kept[0])  # not the last one

    (run / "checkpoint_avg3.pt").unlink()
    assert main(["translate", "average", str(run), "--last", "3"]) == 0
    printed = capsys.readouterr().out
    assert "steps 4, 6, 8" in printed
    again = torch.load(run / "checkpoint_avg3.pt", weights_only=True)["model"]
    assert all(torch.equal(again[k], averaged["model"][k]) for k in again)
    hint = shlex.split(printed.split("score it with: ", 1)[1])  # the printed next command runs as printed
    assert hint[:3] == ["resmlp", "translate", "eval"]
    assert main([*hint[1:], "--beam", "1", "--no-progress"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["chrf"] == pytest.approx(summary["chrf"]) and scored["exact_match"] == summary["exact_match"]

    assert main(["translate", "average", str(run), "--last", "5"]) == 2  # fairseq refuses too few as well
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "keeps 3 checkpoints" in err and "--average-last 5" in err


def test_a_resume_drops_what_a_killed_run_kept_after_its_checkpoint(corpus, tmp_path):
    run = tmp_path / "run"
    cfg = _config(corpus, run, average_last=2, max_steps=4)
    train_translation(cfg)
    (run / "checkpoint_6.pt").write_bytes((run / "checkpoint_4.pt").read_bytes())  # kept after checkpoint.pt: step 4
    train_translation(dataclasses.replace(cfg, max_steps=6), resume=True)
    assert [step for step, _ in kept_checkpoints(run)] == [4, 6]
    assert torch.equal(torch.load(run / "checkpoint_6.pt", weights_only=True)["model"]["src_embed.weight"],
                       _weights(run)["src_embed.weight"])  # the resumed run's own step 6


def test_average_state_dicts_is_the_element_wise_mean_and_refuses_other_models():
    states = [{"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])},
              {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([1.5])},
              {"w": torch.tensor([2.0, 1.0]), "b": torch.tensor([-2.0])}]
    mean = average_state_dicts(states)
    assert mean["w"].tolist() == [2.0, 3.0] and mean["b"].tolist() == [0.0] and mean["w"].dtype == torch.float32
    with pytest.raises(Exception, match="different models"):
        average_state_dicts([states[0], {"w": torch.zeros(3), "b": torch.zeros(1)}])
