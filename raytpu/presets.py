"""Model presets: Llama-style decoder-only shapes, their arithmetic, and the mesh that runs them.

Stdlib only (the core floor): the driver, the CLI and the docs read these numbers without JAX.

Glossary (MaxText's words):

- **preset**: a decoder-only transformer shape with RMSNorm, rotary position embeddings (RoPE),
  SwiGLU feed-forward and grouped-query attention (GQA: ``n_kv_heads`` key/value heads shared by
  ``n_heads`` query heads). ``1b`` and ``8b`` mirror the public Llama 3.2 1B and Llama 3.1 8B
  configs (Hugging Face ``config.json``); ``tiny`` is for tests on CPU.
- **mesh**: ``dcn_data`` (data parallel across slices, over the data-centre network) times the
  ICI axes inside a slice: ``ici_data`` (replicas), ``ici_fsdp`` (parameters, gradients and
  optimizer state sharded, gathered per layer) and ``ici_tensor`` (each matmul split). The ICI
  axes multiply to the chips of one slice, as MaxText's ``ici_*_parallelism`` must.
- **memory per chip**: fp32 master weights, fp32 gradients and AdamW's two fp32 moments
  (16 bytes per parameter) sharded over ``fsdp x tensor``, a bf16 copy of one layer's weights
  gathered for compute, activations with each layer's input saved (full rematerialisation) and
  the fp32 logits of the per-chip batch. An estimate: XLA's buffers differ by some percent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from raytpu.catalog import SliceShape
from raytpu.errors import invalid

GIB = 2**30
BYTES_PER_PARAM_STATE = 16
"""fp32 master weights (4) + fp32 gradients (4) + AdamW first and second moments (4 + 4)."""
HBM_HEADROOM = 0.9
"""Share of a chip's HBM a preset may plan for; the rest is XLA's scratch and fragmentation."""
COMPUTE_DTYPES = ("bfloat16", "float32")
"""A preset's valid ``dtype`` values (its matmuls' dtype)."""


class PresetError(ValueError):
    """A preset, mesh or batch that cannot run as asked; names the field, value and valid ones."""

    def __init__(self, field: str, value: Any, valid: str, detail: str = "") -> None:
        self.field = field
        self.value = value
        self.valid = valid
        super().__init__(invalid(field, value, valid, reason=detail))


@dataclass(frozen=True)
class Preset:
    """A Llama-style decoder-only shape. Field names follow Hugging Face's ``LlamaConfig``."""

    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    seq_len: int
    rope_theta: float = 500_000.0
    tie_embeddings: bool = False
    published_params: int | None = None
    """The parameter count the mirrored public model states (None for ``tiny``)."""
    source: str = ""
    rms_norm_eps: float = 1e-5
    dtype: str = "bfloat16"
    """The matmul (compute) dtype, one of :data:`COMPUTE_DTYPES`; parameters stay fp32.
    ``float32`` for parity with a reference implementation."""

    def __post_init__(self) -> None:
        if self.dtype not in COMPUTE_DTYPES:
            raise PresetError("dtype", self.dtype, ", ".join(COMPUTE_DTYPES), f"preset {self.name}")
        if not self.rms_norm_eps > 0:
            raise PresetError("rms_norm_eps", self.rms_norm_eps, "a number > 0")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def layer_params(self) -> int:
        """One decoder layer: q, k, v, o projections, gate/up/down, two RMSNorm scales."""
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        attention = d * d + 2 * d * kv + d * d
        mlp = 3 * d * self.d_ff
        return attention + mlp + 2 * d

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)

    @property
    def params(self) -> int:
        """Every parameter: embeddings (and the untied output head), layers, final norm."""
        return self.embedding_params + self.n_layers * self.layer_params + self.d_model

    @property
    def matmul_params(self) -> int:
        """Parameters used in matmuls per token: the layers and the output head (the input
        embedding is a lookup)."""
        norms = 2 * self.d_model
        return self.n_layers * (self.layer_params - norms) + self.vocab_size * self.d_model

    def train_flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): ``6 x matmul params`` plus causal
        attention's ``6 x layers x seq x d_model`` (QK^T and AV, half the square for a causal
        mask: MaxText's count since its PR #1988; its older published MFU figures count the
        whole square, ``12 x layers x seq x d_model``)."""
        seq = seq_len or self.seq_len
        return 6.0 * self.matmul_params + 6.0 * self.n_layers * seq * self.d_model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="tiny",
            vocab_size=512,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            d_ff=128,
            seq_len=64,
            rope_theta=10_000.0,
            source="tests: two layers, GQA 4 query heads over 2 key/value heads",
        ),
        Preset(
            name="1b",
            vocab_size=128_256,
            d_model=2048,
            n_layers=16,
            n_heads=32,
            n_kv_heads=8,
            d_ff=8192,
            seq_len=8192,
            tie_embeddings=True,
            published_params=1_235_814_400,
            source="meta-llama/Llama-3.2-1B config.json (1.24B parameters)",
        ),
        Preset(
            name="8b",
            vocab_size=128_256,
            d_model=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            d_ff=14_336,
            seq_len=8192,
            published_params=8_030_261_248,
            source="meta-llama/Llama-3.1-8B config.json (8.03B parameters)",
        ),
    )
}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError("preset", name, ", ".join(PRESETS)) from None


@dataclass(frozen=True)
class MeshConfig:
    """Mesh axes, MaxText-style: ``dcn_data`` slices x (``ici_data x ici_fsdp x ici_tensor``)
    chips per slice. Axis names in the JAX mesh: ``data`` (= dcn x ici data), ``fsdp``,
    ``tensor``."""

    dcn_data: int = 1
    ici_data: int = 1
    ici_fsdp: int = 1
    ici_tensor: int = 1

    AXES = ("data", "fsdp", "tensor")

    @property
    def ici_chips(self) -> int:
        return self.ici_data * self.ici_fsdp * self.ici_tensor

    @property
    def devices(self) -> int:
        return self.dcn_data * self.ici_chips

    @property
    def shape(self) -> tuple[int, int, int]:
        """The JAX mesh's shape over :attr:`AXES`."""
        return (self.dcn_data * self.ici_data, self.ici_fsdp, self.ici_tensor)

    def check(self, chips_per_slice: int, num_slices: int) -> MeshConfig:
        """Raise :class:`PresetError` unless the axes tile ``num_slices`` slices exactly."""
        for field in ("dcn_data", "ici_data", "ici_fsdp", "ici_tensor"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise PresetError(f"mesh.{field}", value, "an integer >= 1")
        if self.dcn_data != num_slices:
            raise PresetError(
                "mesh.dcn_data", self.dcn_data, f"{num_slices} (the number of slices)"
            )
        if self.ici_chips != chips_per_slice:
            raise PresetError(
                "mesh.ici_data x ici_fsdp x ici_tensor",
                self.ici_chips,
                f"{chips_per_slice} (the chips of one slice)",
                f"{self.ici_data} x {self.ici_fsdp} x {self.ici_tensor}",
            )
        return self

    @classmethod
    def fsdp_over(cls, chips_per_slice: int, num_slices: int = 1, tensor: int = 1) -> MeshConfig:
        """Data parallel across slices, FSDP over every chip of a slice (MaxText's default), or
        over what ``tensor`` parallelism leaves of it; ``tensor`` must divide the slice."""
        if tensor < 1 or chips_per_slice % tensor:
            raise PresetError(
                "mesh.ici_tensor", tensor, f"a divisor of the slice's {chips_per_slice} chips"
            )
        return cls(dcn_data=num_slices, ici_fsdp=chips_per_slice // tensor, ici_tensor=tensor)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one chip needs to train a preset on a mesh (see the module docstring)."""

    state_bytes: float
    gathered_layer_bytes: float
    activation_bytes: float
    logits_bytes: float

    @property
    def total_bytes(self) -> float:
        return (
            self.state_bytes + self.gathered_layer_bytes + self.activation_bytes + self.logits_bytes
        )

    def describe(self) -> str:
        return (
            f"{self.total_bytes / GIB:.1f} GiB = state {self.state_bytes / GIB:.1f} + gathered "
            f"layer {self.gathered_layer_bytes / GIB:.2f} + activations "
            f"{self.activation_bytes / GIB:.1f} + logits {self.logits_bytes / GIB:.1f}"
        )


def memory_per_chip(
    model: Preset, mesh: MeshConfig, batch_per_chip: int = 1, seq_len: int | None = None
) -> MemoryEstimate:
    """Estimated HBM per chip for training ``model`` with ``batch_per_chip`` sequences."""
    seq = seq_len or model.seq_len
    shards = mesh.ici_fsdp * mesh.ici_tensor
    tokens = batch_per_chip * seq
    # Per layer with full remat: the saved bf16 layer input, plus the live working set of the
    # layer being recomputed (q/k/v/o, SwiGLU's three d_ff-wide tensors), split by tensor.
    saved = model.n_layers * tokens * model.d_model * 2
    kv = 2 * model.n_kv_heads * model.head_dim
    working = tokens * (4 * model.d_model + kv + 3 * model.d_ff) * 2 / mesh.ici_tensor
    return MemoryEstimate(
        state_bytes=BYTES_PER_PARAM_STATE * model.params / shards,
        gathered_layer_bytes=2.0 * model.layer_params / mesh.ici_tensor,
        activation_bytes=saved + working,
        logits_bytes=4.0 * tokens * model.vocab_size / mesh.ici_tensor,
    )


def check_fits(
    model: Preset,
    shape: SliceShape,
    mesh: MeshConfig,
    *,
    num_slices: int = 1,
    batch_per_chip: int = 1,
    seq_len: int | None = None,
) -> MemoryEstimate:
    """The estimate, or :class:`PresetError` naming the preset, the GiB it needs per chip, the
    chip's HBM and the presets that fit this slice and mesh."""
    mesh.check(shape.chips, num_slices)
    need = memory_per_chip(model, mesh, batch_per_chip, seq_len)
    hbm = shape.generation.hbm_gib * GIB
    if need.total_bytes <= HBM_HEADROOM * hbm:
        return need
    fitting = [
        p.name
        for p in PRESETS.values()
        if memory_per_chip(p, mesh, batch_per_chip, seq_len).total_bytes <= HBM_HEADROOM * hbm
    ]
    raise PresetError(
        "preset",
        model.name,
        ", ".join(fitting) or "none at this batch and sequence length",
        f"needs {need.describe()} per chip on {shape.generation.name} {shape.topology} with "
        f"mesh {mesh.shape} (data, fsdp, tensor), batch {batch_per_chip} x "
        f"{seq_len or model.seq_len} tokens per chip; a {shape.generation.name} chip has "
        f"{shape.generation.hbm_gib} GiB HBM, {HBM_HEADROOM:.0%} usable = "
        f"{HBM_HEADROOM * shape.generation.hbm_gib:.1f} GiB",
    )


def mfu_estimate(
    model: Preset, shape: SliceShape, tokens_per_chip_per_s: float, seq_len: int | None = None
) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s per chip over the catalog's peak."""
    achieved = model.train_flops_per_token(seq_len) * tokens_per_chip_per_s
    return achieved / (shape.generation.peak_bf16_tflops * 1e12)


@dataclass(frozen=True)
class ScaleConfig:
    """What to train at scale: a preset on a mesh (``run_training(..., scale=...)``), or with
    ``init_from`` the Llama of a Hugging Face folder (local or ``gs://``: its ``config.json``
    is the preset, its safetensors the first step's weights; :mod:`workloads.model.hf_llama`)."""

    preset: str = "tiny"
    mesh: MeshConfig = MeshConfig()
    init_from: str = ""

    def check(
        self, shape: SliceShape, num_slices: int, global_batch: int, model: Preset | None = None
    ) -> MemoryEstimate:
        """Raise :class:`PresetError` unless the preset (``model``: the one ``init_from``'s
        config.json gives) divides over the mesh and fits the slice's HBM at ``global_batch``
        sequences per step; the memory estimate otherwise."""
        model = model or preset(self.preset)
        self.mesh.check(shape.chips, num_slices)
        divisible = (
            ("d_model", model.d_model, self.mesh.ici_fsdp, "mesh.ici_fsdp"),
            ("n_kv_heads", model.n_kv_heads, self.mesh.ici_tensor, "mesh.ici_tensor"),
            ("d_ff", model.d_ff, self.mesh.ici_tensor, "mesh.ici_tensor"),
            ("vocab_size", model.vocab_size, self.mesh.ici_tensor, "mesh.ici_tensor"),
        )
        for dim, size, axis, field in divisible:
            if size % axis:
                raise PresetError(
                    field, axis, f"a divisor of the preset's {dim} ({size})", f"preset {model.name}"
                )
        devices = self.mesh.devices
        if global_batch % devices:
            raise PresetError(
                "train.global_batch", global_batch, f"a multiple of the mesh's {devices} devices"
            )
        return check_fits(
            model, shape, self.mesh, num_slices=num_slices, batch_per_chip=global_batch // devices
        )

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "mesh": asdict(self.mesh), "init_from": self.init_from}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ScaleConfig:
        unknown = set(raw) - {"preset", "mesh", "init_from"}
        if unknown:
            raise PresetError("scale", sorted(unknown)[0], "preset, mesh, init_from")
        mesh_raw = dict(raw.get("mesh") or {})
        mesh_keys = {"dcn_data", "ici_data", "ici_fsdp", "ici_tensor"}
        if set(mesh_raw) - mesh_keys:
            bad = sorted(set(mesh_raw) - mesh_keys)[0]
            raise PresetError("scale.mesh", bad, ", ".join(sorted(mesh_keys)))
        return cls(
            preset=str(raw.get("preset", "tiny")),
            mesh=MeshConfig(**mesh_raw),
            init_from=str(raw.get("init_from") or ""),
        )
