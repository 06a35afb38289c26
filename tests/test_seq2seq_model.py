"""Seq2seq ResMLP / Transformer: causality, padding invariance, incremental == full decoding."""

from __future__ import annotations

import math

import pytest
import torch

from resmlp.seq2seq.model import Seq2SeqConfig, build_translation_model, translation_model_config

VOCAB = 23


def random_model(arch: str, **kw) -> torch.nn.Module:
    """Tiny model with every parameter randomised (Affine betas, LayerScales, biases non-trivial), so a
    leak through padding or from the future would show up."""
    torch.manual_seed(0)
    model = build_translation_model(translation_model_config("tiny", VOCAB, arch=arch, dropout=0.0, **kw))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def tokens(b: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


ARCH_VARIANTS = [("resmlp", {}), ("resmlp", {"positions": "none"}), ("transformer", {})]


@pytest.mark.parametrize(("arch", "kw"), ARCH_VARIANTS)
def test_decoder_is_causal(arch, kw):
    model = random_model(arch, **kw)
    src, tgt = tokens(2, 7, 1), tokens(2, 9, 2)
    j = 5
    changed = tgt.clone()
    changed[:, j] = (changed[:, j] + 1 - 3) % (VOCAB - 3) + 3
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :j], b[:, :j], rtol=0, atol=1e-5)
    assert (a[:, j:] - b[:, j:]).abs().amax() > 1e-3  # the change does reach position j onwards


@pytest.mark.parametrize(("arch", "kw"), ARCH_VARIANTS)
def test_encoder_output_same_alone_and_padded(arch, kw):
    model = random_model(arch, **kw)
    short = tokens(1, 4, 3)
    batch = tokens(3, 11, 4)
    batch[1] = 0  # pad id
    batch[1, :4] = short[0]
    with torch.no_grad():
        alone = model.encode(short).out
        padded = model.encode(batch)
    assert padded.pad_mask[1].tolist() == [False] * 4 + [True] * 7
    torch.testing.assert_close(padded.out[1, :4], alone[0], rtol=0, atol=1e-5)


def test_resmlp_padding_must_be_zeroed_for_invariance():
    """Without zeroing padded rows before the token mixing, padding leaks into real tokens (control)."""
    model = random_model("resmlp")
    short = tokens(1, 4, 3)
    padded = torch.cat([short, torch.zeros(1, 6, dtype=torch.long)], 1)
    with torch.no_grad():
        x = model.src_embed(padded) * model.embed_scale
        ones = torch.ones(1, padded.shape[1], 1)
        for layer in model.encoder:
            x = layer(x, ones)  # keep everything: the broken variant
        leaked = model.encoder_norm(x)[0, :4]
        assert (leaked - model.encode(short).out[0]).abs().amax() > 1e-3


@pytest.mark.parametrize(("arch", "kw"), ARCH_VARIANTS)
def test_incremental_decoding_equals_full_recomputation(arch, kw):
    model = random_model(arch, **kw)
    src = tokens(3, 8, 5)
    src[0, 5:] = 0  # one padded source in the batch
    tgt_in = torch.cat([torch.ones(3, 1, dtype=torch.long), tokens(3, 9, 6)], 1)
    with torch.no_grad():
        memory = model.encode(src)
        full = model.decode(tgt_in, memory)
        state = model.init_state(memory)
        steps = torch.stack([model.step(tgt_in[:, t], state) for t in range(tgt_in.shape[1])], 1)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-4)


def test_resmlp_incremental_state_is_per_layer_history_not_recomputation():
    """Step t reads only the cached history: corrupting an earlier cached row changes the output."""
    model = random_model("resmlp")
    src, tgt_in = tokens(1, 5, 7), tokens(1, 4, 8)
    with torch.no_grad():
        state = model.init_state(model.encode(src))
        for t in range(3):
            model.step(tgt_in[:, t], state)
        probe = state.history.clone()
        clean = model.step(tgt_in[:, 3], state)
        state.history, state.t = probe, 3
        state.history[0, :, 0] += 1.0
        corrupted = model.step(tgt_in[:, 3], state)
    assert (clean - corrupted).abs().amax() > 1e-4


def test_inputs_longer_than_max_len_get_a_clear_error():
    model = random_model("resmlp")
    with pytest.raises(ValueError, match="max_len is 16"):
        model.encode(tokens(1, 17, 9))


def test_sinusoidal_positions_tell_identical_tokens_apart():
    same = torch.full((1, 6), 5)
    for kw, distinct in (({"positions": "none"}, False), ({"positions": "sinusoidal"}, True)):
        model = random_model("resmlp", **kw)
        with torch.no_grad():
            for layer in [*model.encoder, *model.decoder]:  # silence A, the other source of position
                layer.token_mix.weight.zero_()
                layer.token_mix.bias.zero_()
            encoded = model.encode(same).out[0]
            logits = model.decode(same, model.encode(same))[0]
        assert ((encoded[0] - encoded[3]).abs().amax() > 1e-3) == distinct
        assert ((logits[0] - logits[3]).abs().amax() > 1e-3) == distinct
    with pytest.raises(ValueError, match="unknown positions"):
        translation_model_config("tiny", VOCAB, positions="learned")


def test_config_round_trip_and_validation():
    cfg = translation_model_config("tiny", VOCAB, arch="transformer")
    assert Seq2SeqConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="arch"):
        Seq2SeqConfig(vocab_size=10, arch="rnn")
    with pytest.raises(ValueError, match="preset"):
        translation_model_config("huge", VOCAB)


def test_resmlp_initial_logits_do_not_favour_repeating_the_input_token():
    """With tied, sqrt(dim)-scaled embeddings and a non-normalising final Affine at gain 1, the logit of the
    decoder's own input token starts near sqrt(dim), so the first loss is ~sqrt(dim) instead of ~ln(vocab)."""
    torch.manual_seed(0)
    vocab = 400
    model = build_translation_model(translation_model_config("tiny", vocab, arch="resmlp", dim=128, dropout=0.0)).eval()
    src, tgt = torch.randint(3, vocab, (8, 12)), torch.randint(3, vocab, (8, 13))
    with torch.no_grad():
        logits = model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    assert loss < math.log(vocab) + 0.5, loss
    confidence = logits.softmax(-1).amax(-1).mean()
    assert confidence < 0.05, confidence  # with gain 1: ~1.0, all of it on repeating the input token


def test_the_resmlp_ffn_is_gelu_as_the_paper_and_the_transformer_relu_as_fairseq():
    """Paper section 2, eq. 3: the ResMLP layer is "the feedforward sublayer of a Transformer with the ReLU
    non-linearity replaced by a GELU"; fairseq's transformer base_architecture: activation_fn "relu"."""
    resmlp = build_translation_model(translation_model_config("tiny", VOCAB, arch="resmlp"))
    for layer in (*resmlp.encoder, *resmlp.decoder):
        assert isinstance(layer.ffn[1], torch.nn.GELU) and layer.ffn[1].approximate == "none"
    transformer = build_translation_model(translation_model_config("tiny", VOCAB, arch="transformer"))
    for layer in (*transformer.encoder.layers, *transformer.decoder.layers):
        assert layer.activation is torch.nn.functional.relu
    relu = build_translation_model(translation_model_config("tiny", VOCAB, arch="resmlp", activation="relu"))
    assert isinstance(relu.encoder[0].ffn[1], torch.nn.ReLU)
    with pytest.raises(ValueError, match="activation"):
        translation_model_config("tiny", VOCAB, activation="swish")


@pytest.mark.parametrize("arch", ["resmlp", "transformer"])
def test_dropout_acts_where_fairseqs_transformer_puts_it(arch):
    """fairseq's base_architecture: dropout 0.1 on the embeddings and each sublayer's output, attention_dropout and
    activation_dropout 0.0; both models take the three rates apart."""
    model = build_translation_model(translation_model_config("tiny", VOCAB, arch=arch, dropout=0.15))
    assert model.embed_drop.p == 0.15
    if arch == "resmlp":
        for layer in (*model.encoder, *model.decoder):
            assert layer.drop.p == 0.15 and layer.ffn[2].p == 0.0
        assert all(layer.attn.dropout == 0.0 for layer in model.decoder)
    else:
        for layer in (*model.encoder.layers, *model.decoder.layers):
            assert layer.dropout1.p == layer.dropout2.p == 0.15 and layer.dropout.p == 0.0
            assert layer.self_attn.dropout == 0.0
        assert all(layer.multihead_attn.dropout == 0.0 for layer in model.decoder.layers)
    custom = build_translation_model(translation_model_config("tiny", VOCAB, arch=arch, attention_dropout=0.2,
                                                              activation_dropout=0.3))
    if arch == "resmlp":
        assert custom.decoder[0].attn.dropout == 0.2 and custom.encoder[0].ffn[2].p == 0.3
    else:
        assert custom.decoder.layers[0].multihead_attn.dropout == 0.2 and custom.encoder.layers[0].dropout.p == 0.3


def test_model_configs_saved_before_these_options_read_as_what_they_trained():
    """A checkpoint's model_config without the newer fields was trained with a ReLU FFN, dropout on attention and
    activations at the residual rate, and sources without EOS: it loads as that model, not as today's default."""
    old = {k: v for k, v in translation_model_config("tiny", VOCAB).to_dict().items()
           if k not in ("activation", "attention_dropout", "activation_dropout", "source_eos")}
    cfg = Seq2SeqConfig.from_dict({**old, "dropout": 0.25})
    assert (cfg.activation, cfg.attention_dropout, cfg.activation_dropout, cfg.source_eos) == ("relu", 0.25, 0.25,
                                                                                               False)
    new = translation_model_config("tiny", VOCAB)
    assert (new.activation, new.attention_dropout, new.activation_dropout, new.source_eos) == ("gelu", 0.0, 0.0, True)
    assert Seq2SeqConfig.from_dict(new.to_dict()) == new
