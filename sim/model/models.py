"""Model descriptions: the shape of a decoder-only transformer, as the estimator needs it.

A :class:`ModelSpec` is what a model card states: layers, hidden size, FFN size,
attention heads, key/value heads (grouped-query attention), vocabulary, sequence
length, whether the input embedding and the output layer share their weights, and
the bytes of one parameter / activation element (2 for bf16 / fp16).

Presets (:data:`PRESETS`, ``--model NAME``) are functions returning a spec; each one's
docstring names its source. ``--model FILE.json`` reads the same fields from a JSON
object; unknown keys, missing keys and impossible shapes raise :class:`ModelError`::

    {"name": "my-model", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 50304, "seq_len": 2048}

(``ffn`` defaults to 4 x hidden, ``kv_heads`` to ``heads``.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sim.errors import PipesimError
from sim.files import preset_or_file, read_spec

__all__ = ["ModelSpec", "ModelError", "LIMITS", "PRESETS", "preset_names", "get_model", "load_model"]


LIMITS = {"layers": 100_000, "hidden": 2**20, "heads": 2**16, "ffn": 2**22, "kv_heads": 2**16, "vocab": 2**24,
          "seq_len": 2**24}
"""The largest value each field may take. Far above any published model (Llama 3 405B: 126 layers, hidden 16384,
vocabulary 128256, 8192 tokens), and low enough that every FLOP and byte count of the estimate stays a finite
float and every per-layer list stays small: a file asking for 10**12 layers or a hidden size of 10**200 is refused
in one line instead of running out of memory or overflowing."""


class ModelError(PipesimError):
    """A model description that cannot be used: unknown preset, bad file, impossible shape."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer of ``layers`` identical blocks between an embedding and an output layer."""

    name: str = "custom"
    """A label for reports."""
    layers: int
    """L, transformer blocks."""
    hidden: int
    """h, the model width."""
    heads: int
    """a, attention heads (query heads)."""
    ffn: int = 0
    """f, width of the MLP's inner layer (0: 4 h, GPT's choice)."""
    kv_heads: int = 0
    """Key/value heads; fewer than ``heads`` is grouped-query attention (0: equal to ``heads``)."""
    vocab: int
    """V, vocabulary size (0: no embedding and no output layer, as the validator's transformer workload)."""
    seq_len: int
    """s, tokens per sample."""
    tied_embeddings: bool = False
    """True: the output layer reuses the input embedding's weights (GPT-3); False: separate (Llama 3)."""
    gated_mlp: bool = False
    """True: SwiGLU MLP with three f x h matrices (Llama); False: two (GPT, GELU)."""
    dropout: bool = True
    """True: dropout after attention, MLP and embedding keeps 1-byte masks (Korthikanti et al.'s setting)."""
    dtype_bytes: int = 2
    """Bytes of one parameter and one activation element: 2 (bf16/fp16) or 4 (fp32)."""

    def __post_init__(self) -> None:
        for label in ("layers", "hidden", "heads", "seq_len"):
            _positive(self, label)
        for label in ("ffn", "kv_heads", "vocab"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelError(f"model {label} must be an integer >= 0, got {value!r}")
        for label, top in LIMITS.items():
            value = getattr(self, label)
            if value > top:
                raise ModelError(f"model {label} = {value if value < 10**30 else f'{value:.3e}'} is above the limit "
                                 f"of {top:,}; check the model file (pipesim's limits: sim.model.models.LIMITS)")
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.hidden % self.heads:
            raise ModelError(f"hidden size {self.hidden} must be divisible by the {self.heads} heads")
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise ModelError(f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads}")
        if self.dtype_bytes not in (1, 2, 4, 8):
            raise ModelError(f"dtype_bytes must be 1, 2, 4 or 8, got {self.dtype_bytes!r}")
        for label in ("tied_embeddings", "gated_mlp", "dropout"):
            if not isinstance(getattr(self, label), bool):
                raise ModelError(f"model {label} must be true or false, got {getattr(self, label)!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ModelError(f"model name must be a non-empty string, got {self.name!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of the key (and of the value) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """Parameters of one block: Q, K, V and output projections, the MLP matrices, two norms (weight + bias).

        With kv_hidden = h and f = 4h this is 12 h^2 + 4 h, Narayanan et al. 2021 (SC'21), appendix:
        P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) without the biases of the linear layers.
        """
        h, f = self.hidden, self.ffn
        attention = h * (h + 2 * self.kv_hidden) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        return attention + mlp + 4 * h

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        """All parameters: blocks, embedding, and the output layer unless tied (plus the final norm)."""
        output = 0 if self.tied_embeddings else self.embedding_parameters
        return self.layers * self.layer_parameters + self.embedding_parameters + output + 2 * self.hidden

    def to_dict(self) -> dict:
        return asdict(self)


def _positive(spec: ModelSpec, label: str) -> None:
    value = getattr(spec, label)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(f"model {label} must be a positive integer, got {value!r}")


def gpt3_175b() -> ModelSpec:
    """GPT-3 175B: Brown et al., "Language Models are Few-Shot Learners" (2020), Table 2.1 (96 layers,
    d_model 12288, 96 heads, context 2048; FFN 4 x d_model). Vocabulary 51200: GPT-2's 50257 padded to a
    multiple of 1024 as in Narayanan et al. 2021 (SC'21), Table 1. Tied embeddings, GELU MLP, dropout."""
    return ModelSpec(name="gpt3-175b", layers=96, hidden=12288, heads=96, ffn=4 * 12288, vocab=51200,
                     seq_len=2048, tied_embeddings=True, gated_mlp=False, dropout=True)


def llama3_8b() -> ModelSpec:
    """Llama 3 8B: Llama Team, "The Llama 3 Herd of Models" (2024), Table 3 (32 layers, model dimension 4096,
    FFN 14336, 32 heads, 8 key/value heads, vocabulary 128000 -> 128256 in the released config.json),
    sequence 8192 (pre-training), SwiGLU, untied output layer, no dropout."""
    return ModelSpec(name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                     seq_len=8192, tied_embeddings=False, gated_mlp=True, dropout=False)


def llama3_70b() -> ModelSpec:
    """Llama 3 70B: "The Llama 3 Herd of Models" (2024), Table 3 (80 layers, 8192, FFN 28672, 64 heads,
    8 KV heads), vocabulary 128256, sequence 8192."""
    return ModelSpec(name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256,
                     seq_len=8192, tied_embeddings=False, gated_mlp=True, dropout=False)


def llama3_405b() -> ModelSpec:
    """Llama 3 405B: "The Llama 3 Herd of Models" (2024), Table 3 (126 layers, 16384, FFN 53248, 128 heads,
    8 KV heads), vocabulary 128256, sequence 8192."""
    return ModelSpec(name="llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248,
                     vocab=128256, seq_len=8192, tied_embeddings=False, gated_mlp=True, dropout=False)


def small_gpt() -> ModelSpec:
    """The validator's transformer workload (:mod:`validate.rank.workloads`, defaults): d_model 32, 2 heads, seq 16,
    ``nn.TransformerEncoderLayer`` with FFN 4 x d_model, dropout 0, fp32; 2 layers per stage x 2 stages = 4
    layers. Its input is a random (batch, seq, d_model) tensor: no embedding, no output layer (vocab 0)."""
    return ModelSpec(name="small-gpt", layers=4, hidden=32, heads=2, ffn=128, vocab=0, seq_len=16,
                     tied_embeddings=False, gated_mlp=False, dropout=False, dtype_bytes=4)


PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "gpt3-175b": gpt3_175b,
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "llama3-405b": llama3_405b,
    "small-gpt": small_gpt,
}


def preset_names() -> list[str]:
    return list(PRESETS)


def get_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a JSON file (anything ending in .json or naming an existing file)."""
    return preset_or_file(name_or_path, PRESETS, load_model, what="model", error=ModelError)


_REQUIRED = ("layers", "hidden", "heads", "vocab", "seq_len")


def load_model(path: str | Path) -> ModelSpec:
    """Read a model JSON file (fields of :class:`ModelSpec`); raises :class:`ModelError` naming the problem."""
    return read_spec(path, ModelSpec, what="model file", error=ModelError, required=_REQUIRED)
