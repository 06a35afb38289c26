"""Sequence-to-sequence ResMLP (paper section 2) and a Transformer baseline of the same shape.

Both models share one interface used by training and decoding:
``forward(src, tgt_in) -> logits``, ``encode(src) -> Memory``, ``init_state(memory) -> state`` and
``step(tokens, state) -> logits`` (one decoder position at a time), ``state.reorder(index)`` for beam search.

Tokens are (B, T) int64 with ``pad_id`` after the real tokens (right padding).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from resmlp.layers import Affine, LayerScale

ARCHS = ("resmlp", "transformer")
POSITIONS = ("none", "sinusoidal")
ACTIVATIONS = ("gelu", "relu")
# the FFN's non-linearity when none is given: the paper's ResMLP layer is GELU (section 2, eq. 3, "the same as the
# feedforward sublayer of a Transformer with the ReLU non-linearity replaced by a GELU"); the Transformer baseline
# keeps fairseq's (fairseq/models/transformer base_architecture: activation_fn "relu")
DEFAULT_ACTIVATION = {"resmlp": "gelu", "transformer": "relu"}
# what files written before these fields existed were trained with: a ReLU FFN, dropout on attention
# probabilities and FFN activations at the residual rate, sources without EOS (Seq2SeqConfig.from_dict)
_EARLIER_FILES = {"activation": "relu", "source_eos": False}
# The range of each size a real run could use, with room to spare (the paper's largest model: 12 layers, width
# 512, hidden 2048; WMT vocabularies hold 32-40k pieces): past these a typo or an edited checkpoint would
# allocate until memory runs out. Every config passes here: flags, config.json, checkpoints.
LIMITS: dict[str, tuple[int, int]] = {
    "vocab_size": (5, 1_000_000), "dim": (1, 16384), "hidden": (1, 65536), "encoder_layers": (1, 1000),
    "decoder_layers": (1, 1000), "heads": (1, 16384), "max_len": (2, 4096),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Shape of a translation model; `arch` picks ResMLP (linear token mixing) or the Transformer."""

    vocab_size: int
    arch: str = "resmlp"
    dim: int = 512
    hidden: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    heads: int = 8
    max_len: int = 256  # L: size of the cross-token matrices, longest source and target (incl. BOS)
    # where fairseq's transformer puts dropout (models/transformer base_architecture): `dropout` (0.1 there) on
    # the embeddings and on each sublayer's output before its residual sum; attention_dropout (on attention
    # probabilities) and activation_dropout (after the FFN's non-linearity) default to 0.0 there, as here
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str | None = None  # None: DEFAULT_ACTIVATION of the arch
    source_eos: bool = True  # EOS ends every source, as fairseq's binarised data (Dictionary.encode_line)
    layerscale_init: float = 0.2  # paper section 3.6
    # ResMLP only (the Transformer always adds them). "sinusoidal": Vaswani et al.'s encodings added to the
    # embeddings, as in the fairseq setup (Ott et al.) the paper follows, where only self-attention is
    # replaced; "none": as the image model, A alone encodes positions. Sinusoidal measured better: EN->FR
    # number words after 300 steps, 17.6% vs 6.4% exact match (docs/translation.md)
    positions: str = "sinusoidal"
    share_embeddings: bool = True  # one embedding for source and target (joint vocabulary)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name}={value!r}: expected a whole number from {low} to {high}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value!r}: expected a token id from 0 to vocab_size - 1")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not (_is_number(value) and 0 <= value < 1):
                raise ValueError(f"{name}={value!r}: expected a probability in [0, 1)")
        if not (_is_number(self.layerscale_init) and 0 <= self.layerscale_init <= 100):
            raise ValueError(f"layerscale_init={self.layerscale_init!r}: expected a number from 0 to 100 (the paper "
                             "uses 0.2)")
        for name in ("share_embeddings", "source_eos"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected true or false")
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; choose one of {', '.join(ARCHS)}")
        if self.activation is None and self.arch in DEFAULT_ACTIVATION:
            object.__setattr__(self, "activation", DEFAULT_ACTIVATION[self.arch])  # frozen: set once, resolved
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if self.positions not in POSITIONS:
            raise ValueError(f"unknown positions {self.positions!r}; choose one of {', '.join(POSITIONS)}")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must be divisible by heads {self.heads}")

    def replace(self, **kw: Any) -> Seq2SeqConfig:
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Seq2SeqConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown Seq2SeqConfig fields {sorted(map(str, unknown))}")
        if "vocab_size" not in d:
            raise ValueError("a Seq2SeqConfig needs vocab_size")
        earlier = {**_EARLIER_FILES, "attention_dropout": d.get("dropout", 0.1),
                   "activation_dropout": d.get("dropout", 0.1)}
        return cls(**{**{k: v for k, v in earlier.items() if k not in d}, **d})


# The paper's 6- and 12-layer models (dim 512, hidden 2048), plus small ones for CPU demos and tests.
PRESETS: dict[str, dict[str, Any]] = {
    "base6": dict(dim=512, hidden=2048, encoder_layers=6, decoder_layers=6, heads=8),
    "base12": dict(dim=512, hidden=2048, encoder_layers=12, decoder_layers=12, heads=8),
    "small": dict(dim=256, hidden=1024, encoder_layers=3, decoder_layers=3, heads=4, max_len=64),
    "tiny": dict(dim=32, hidden=64, encoder_layers=2, decoder_layers=2, heads=2, max_len=16),
}


@dataclass
class Memory:
    """Encoder output (B, S, C) and its padding mask (B, S), True at padding."""

    out: torch.Tensor
    pad_mask: torch.Tensor

    def reorder(self, index: torch.Tensor) -> Memory:
        return Memory(self.out.index_select(0, index), self.pad_mask.index_select(0, index))


class FeedForward(nn.Sequential):
    """Linear, GELU or ReLU, activation dropout, linear (the sublayer's output dropout is the layer's)."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        act = nn.GELU() if cfg.activation == "gelu" else nn.ReLU()
        super().__init__(nn.Linear(cfg.dim, cfg.hidden), act, nn.Dropout(cfg.activation_dropout),
                         nn.Linear(cfg.hidden, cfg.dim))


class CrossTokenLinear(nn.Module):
    """Residual cross-token linear sublayer for sequences: y = A[:n, :n] x + b[:n] (section 2).

    The encoder uses the full matrix; the decoder masks it lower-triangular so position t only sees s <= t.
    Padded inputs must be zero (the caller zeroes them), so they add nothing to real positions.
    """

    def __init__(self, max_len: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.weight = nn.Parameter(torch.empty(max_len, max_len))
        self.bias = nn.Parameter(torch.zeros(max_len))
        nn.init.trunc_normal_(self.weight, std=0.02)
        if causal:
            self.register_buffer("mask", torch.ones(max_len, max_len).tril().bool(), persistent=False)

    def matrix(self, n: int) -> torch.Tensor:
        a = self.weight[:n, :n]
        return a.masked_fill(~self.mask[:n, :n], 0.0) if self.causal else a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        return torch.matmul(self.matrix(n).to(x.dtype), x) + self.bias[:n, None].to(x.dtype)

    def step(self, history: torch.Tensor, t: int) -> torch.Tensor:
        """Output at position t from the inputs at positions 0..t (B, t+1, C): O(t) per step."""
        a = self.weight[t, : t + 1].to(history.dtype)
        return torch.einsum("s,bsc->bc", a, history) + self.bias[t].to(history.dtype)


class CrossAttention(nn.Module):
    """Multi-head attention from decoder positions to the encoder output, keys/values cacheable."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, c = memory.shape
        k, v = self.kv(memory).view(b, s, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        return k, v

    def forward(
        self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], pad_mask: torch.Tensor
    ) -> torch.Tensor:
        b, t, c = x.shape
        q = self.q(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k, v = kv
        keep = ~pad_mask[:, None, None, :]  # SDPA boolean masks are True where attention is allowed
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.token_norm = Affine(cfg.dim)
        self.token_mix = CrossTokenLinear(cfg.max_len, causal=False)
        self.token_scale = LayerScale(cfg.dim, cfg.layerscale_init)
        self.ffn_norm = Affine(cfg.dim)
        self.ffn = FeedForward(cfg)
        self.ffn_scale = LayerScale(cfg.dim, cfg.layerscale_init)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        # keep: (B, S, 1), 0 at padding. Zeroing the mixer's input stops padding reaching real tokens
        # (the Affine's beta would otherwise make padded rows non-zero).
        x = x + self.drop(self.token_scale(self.token_mix(self.token_norm(x) * keep)))
        return x + self.drop(self.ffn_scale(self.ffn(self.ffn_norm(x))))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.token_norm = Affine(cfg.dim)
        self.token_mix = CrossTokenLinear(cfg.max_len, causal=True)
        self.token_scale = LayerScale(cfg.dim, cfg.layerscale_init)
        self.attn_norm = Affine(cfg.dim)
        self.attn = CrossAttention(cfg.dim, cfg.heads, cfg.attention_dropout)
        self.attn_scale = LayerScale(cfg.dim, cfg.layerscale_init)
        self.ffn_norm = Affine(cfg.dim)
        self.ffn = FeedForward(cfg)
        self.ffn_scale = LayerScale(cfg.dim, cfg.layerscale_init)
        self.drop = nn.Dropout(cfg.dropout)

    def after_mix(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], pad: torch.Tensor):
        x = x + self.drop(self.attn_scale(self.attn(self.attn_norm(x), kv, pad)))
        return x + self.drop(self.ffn_scale(self.ffn(self.ffn_norm(x))))

    def forward(self, x: torch.Tensor, memory: Memory) -> torch.Tensor:
        x = x + self.drop(self.token_scale(self.token_mix(self.token_norm(x))))
        return self.after_mix(x, self.attn.keys_values(memory.out), memory.pad_mask)


class ResMLPState:
    """Incremental decoding state: each layer's normalised token-mixer inputs so far, cached K/V."""

    def __init__(self, model: ResMLPSeq2Seq, memory: Memory) -> None:
        b, dim = memory.out.shape[0], model.config.dim
        n = len(model.decoder)
        self.memory = memory
        self.t = 0
        self.history = memory.out.new_zeros(n, b, model.config.max_len, dim)
        self.kv = [layer.attn.keys_values(memory.out) for layer in model.decoder]

    def reorder(self, index: torch.Tensor) -> None:
        self.memory = self.memory.reorder(index)
        self.history = self.history.index_select(1, index)
        self.kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.kv]


class Seq2SeqBase(nn.Module):
    config: Seq2SeqConfig

    def _init_embeddings(self, cfg: Seq2SeqConfig) -> None:
        self.embed_scale = math.sqrt(cfg.dim)
        self.src_embed = nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=cfg.pad_id)
        nn.init.normal_(self.src_embed.weight, std=cfg.dim**-0.5)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(
            cfg.vocab_size, cfg.dim, padding_idx=cfg.pad_id
        )
        nn.init.normal_(self.tgt_embed.weight, std=cfg.dim**-0.5)
        with torch.no_grad():
            self.tgt_embed.weight[cfg.pad_id].zero_()
            self.src_embed.weight[cfg.pad_id].zero_()
        self.embed_drop = nn.Dropout(cfg.dropout)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Output projection tied to the target embedding."""
        return F.linear(x, self.tgt_embed.weight.to(x.dtype))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt_in, self.encode(src))

    def check_length(self, name: str, tokens: torch.Tensor) -> None:
        if tokens.shape[1] > self.config.max_len:
            raise ValueError(
                f"{name} batch has {tokens.shape[1]} tokens but the model's max_len is "
                f"{self.config.max_len}; "
                "truncate the input (resmlp.seq2seq.data does this) or build the model with a larger max_len"
            )


class ResMLPSeq2Seq(Seq2SeqBase):
    """Encoder-decoder of Vaswani et al. with self-attention replaced by cross-token linear layers."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = cfg
        self._init_embeddings(cfg)
        # A is indexed by position, so the mixing itself knows where tokens are; sinusoidal encodings optional
        self.positions = SinusoidalPositions(cfg.dim, cfg.max_len) if cfg.positions == "sinusoidal" else None
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.encoder_norm = Affine(cfg.dim)
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.decoder_norm = Affine(cfg.dim)
        # At init the residual stream is mostly the token's own embedding scaled by sqrt(dim), and the output
        # projection is tied to that embedding, so with alpha = 1 the logit of "repeat the input token" is
        # ~sqrt(dim) (first loss ~11 at dim 128 against ln(vocab) ~6). The Transformer's final LayerNorm
        # rescales the stream; an Affine cannot, so its gain starts at 1/sqrt(dim) instead: logits start O(1)
        # and the gain is learnt (the T5 tied-output rescaling, made learnable). Measured in docs/translation.md.
        nn.init.constant_(self.decoder_norm.alpha, cfg.dim**-0.5)

    def encode(self, src: torch.Tensor) -> Memory:
        self.check_length("source", src)
        pad = src.eq(self.config.pad_id)
        keep = (~pad).unsqueeze(-1).to(self.src_embed.weight.dtype)
        x = self.embed_drop(self._positions(self.src_embed(src) * self.embed_scale))
        for layer in self.encoder:
            x = layer(x, keep)
        return Memory(self.encoder_norm(x), pad)

    def decode(self, tgt_in: torch.Tensor, memory: Memory) -> torch.Tensor:
        self.check_length("target", tgt_in)
        # padded target positions come after the real ones, and the causal A never looks forward
        x = self.embed_drop(self._positions(self.tgt_embed(tgt_in) * self.embed_scale))
        for layer in self.decoder:
            x = layer(x, memory)
        return self.logits(self.decoder_norm(x))

    def _positions(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.positions is None else self.positions(x)

    def init_state(self, memory: Memory) -> ResMLPState:
        return ResMLPState(self, memory)

    def step(self, tokens: torch.Tensor, state: ResMLPState) -> torch.Tensor:
        """Logits (B, V) for the next position given the previous token (B,); updates `state`."""
        t = state.t
        if t >= self.config.max_len:
            raise ValueError(f"cannot decode past the model's max_len {self.config.max_len}")
        x = self.tgt_embed(tokens) * self.embed_scale
        if self.positions is not None:
            x = x + self.positions.pe[t].to(x.dtype)
        for i, layer in enumerate(self.decoder):
            state.history[i, :, t] = layer.token_norm(x)
            mixed = layer.token_mix.step(state.history[i, :, : t + 1], t)
            x = x + layer.token_scale(mixed)
            x = layer.after_mix(x[:, None], state.kv[i], state.memory.pad_mask)[:, 0]
        state.t = t + 1
        return self.logits(self.decoder_norm(x))


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position encodings (Vaswani et al.) added to the Transformer's embeddings."""

    def __init__(self, dim: int, max_len: int) -> None:
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
        pe = torch.zeros(max_len, dim)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe[: x.shape[1]].to(x.dtype)


class TransformerState:
    """The Transformer baseline decodes by recomputing its decoder over the prefix (torch's layers
    have no key/value cache); only the ResMLP decoder is incremental."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self.tokens = memory.out.new_zeros(memory.out.shape[0], 0, dtype=torch.long)

    def reorder(self, index: torch.Tensor) -> None:
        self.memory = self.memory.reorder(index)
        self.tokens = self.tokens.index_select(0, index)


class TransformerSeq2Seq(Seq2SeqBase):
    """Pre-norm Transformer baseline from torch.nn.TransformerEncoderLayer / TransformerDecoderLayer."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = cfg
        self._init_embeddings(cfg)
        self.positions = SinusoidalPositions(cfg.dim, cfg.max_len)

        def layer_kw() -> dict[str, Any]:
            return dict(d_model=cfg.dim, nhead=cfg.heads, dim_feedforward=cfg.hidden, dropout=cfg.dropout,
                        activation=cfg.activation, batch_first=True, norm_first=True)

        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer_kw()), cfg.encoder_layers, norm=nn.LayerNorm(cfg.dim),
            enable_nested_tensor=False,
        )
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer_kw()), cfg.decoder_layers, norm=nn.LayerNorm(cfg.dim)
        )
        _fairseq_dropouts([*self.encoder.layers, *self.decoder.layers], cfg)

    def encode(self, src: torch.Tensor) -> Memory:
        self.check_length("source", src)
        pad = src.eq(self.config.pad_id)
        x = self.embed_drop(self.positions(self.src_embed(src) * self.embed_scale))
        return Memory(self.encoder(x, src_key_padding_mask=pad), pad)

    def decode(self, tgt_in: torch.Tensor, memory: Memory) -> torch.Tensor:
        self.check_length("target", tgt_in)
        n = tgt_in.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=tgt_in.device).triu(1)  # True = blocked
        x = self.embed_drop(self.positions(self.tgt_embed(tgt_in) * self.embed_scale))
        # tgt_is_causal: torch then trusts the mask is causal instead of checking it (a host read per call)
        x = self.decoder(x, memory.out, tgt_mask=causal, tgt_is_causal=True,
                         memory_key_padding_mask=memory.pad_mask)
        return self.logits(x)

    def init_state(self, memory: Memory) -> TransformerState:
        return TransformerState(memory)

    def step(self, tokens: torch.Tensor, state: TransformerState) -> torch.Tensor:
        if state.tokens.shape[1] >= self.config.max_len:
            raise ValueError(f"cannot decode past the model's max_len {self.config.max_len}")
        state.tokens = torch.cat([state.tokens, tokens[:, None]], dim=1)
        return self.decode(state.tokens, state.memory)[:, -1]


def _fairseq_dropouts(layers: list[nn.Module], cfg: Seq2SeqConfig) -> None:
    """torch's Transformer layers take one dropout rate for their residual branches, attention probabilities and
    FFN activations; fairseq's take three: the attention modules and the FFN's dropout get theirs here."""
    for layer in layers:
        for name in ("self_attn", "multihead_attn"):
            if hasattr(layer, name):
                getattr(layer, name).dropout = cfg.attention_dropout
        layer.dropout.p = cfg.activation_dropout


def build_translation_model(cfg: Seq2SeqConfig) -> Seq2SeqBase:
    return ResMLPSeq2Seq(cfg) if cfg.arch == "resmlp" else TransformerSeq2Seq(cfg)


def translation_model_config(preset: str, vocab_size: int, **overrides: Any) -> Seq2SeqConfig:
    """Config of a named preset (base6, base12, small, tiny) with field overrides."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return Seq2SeqConfig(vocab_size=vocab_size, **{**PRESETS[preset], **overrides})
