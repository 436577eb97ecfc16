"""A GPT-style decoder cut into pipeline stages, in plain ``torch.nn``: an example of ``--workload``.

Run it through pipesim's executor and through PyTorch's own runtime (from the repository root)::

    pipesim validate -s 1f1b -K 2 -M 4 --workload examples.gpt_decoder:pipeline
    pipesim validate --runtime torch -s 1f1b -K 2 -M 4 --workload examples.gpt_decoder:pipeline

:func:`pipeline` follows the protocol of :mod:`validate.rank.user_model`: it gets the number of
stages and returns ``(stage_modules, make_batch, loss)``. Stage 0 embeds token ids, every stage runs
``BLOCKS_PER_STAGE`` pre-norm decoder blocks (causal self-attention + MLP, as GPT-2: Radford et al.
2019, section 2.3), the last stage adds the final LayerNorm and the language-model head. The data is a
toy language that a decoder can learn: each sample is an arithmetic sequence of tokens modulo the
vocabulary, with a start and a step drawn per sample, and the target is the next token.
Sizes are small enough for a CPU (one stage forward is a few milliseconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 128       # tokens
    seq: int = 32          # tokens per sample (context length)
    d_model: int = 64      # width of the residual stream
    heads: int = 4         # attention heads (d_model / heads per head)
    batch: int = 8         # samples per micro-batch


BLOCKS_PER_STAGE = 2


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        # token t attends to tokens <= t; a bool buffer is not cast by .to(float64) (the validator's reference)
        self.register_buffer("causal", torch.tril(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, h, T, hs)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)                              # (B, h, T, T)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)                                            # (B, T, C)
        return self.proj(y)


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class DecoderStage(nn.Module):
    """One pipeline stage: [token + position embedding] -> blocks -> [final norm + LM head]."""

    def __init__(self, cfg: GPTConfig, *, first: bool, last: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model) if first else None
        self.position = nn.Embedding(cfg.seq, cfg.d_model) if first else None
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(BLOCKS_PER_STAGE)])
        self.norm = nn.LayerNorm(cfg.d_model) if last else None
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:  # x: token ids (B, T) -> (B, T, C)
            x = self.embed(x) + self.position(torch.arange(x.shape[1], device=x.device))
        x = self.blocks(x)
        if self.head is not None:  # (B, T, C) -> logits (B, T, vocab)
            x = self.head(self.norm(x))
        return x


def make_batch_fn(cfg: GPTConfig):
    def make_batch(mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch *mb*: (tokens (B, T), next tokens (B, T)); a pure function of *mb*."""
        gen = torch.Generator().manual_seed(1_000 + mb)
        start = torch.randint(cfg.vocab, (cfg.batch, 1), generator=gen)
        step = torch.randint(1, 8, (cfg.batch, 1), generator=gen)
        tokens = (start + step * torch.arange(cfg.seq + 1)) % cfg.vocab  # (B, T + 1)
        return tokens[:, :-1], tokens[:, 1:]

    return make_batch


def next_token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the micro-batch's tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def pipeline(stages: int, cfg: GPTConfig = GPTConfig()):
    """The validator's entry point: (stage modules, make_batch, loss) for *stages* stages."""
    modules = [DecoderStage(cfg, first=s == 0, last=s == stages - 1) for s in range(stages)]
    return modules, make_batch_fn(cfg), next_token_loss
