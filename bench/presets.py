"""Preset arithmetic per TPU generation: where each preset fits, FLOPs, and an MFU estimate.

Pure arithmetic from :mod:`raytpu.presets` and the catalog (no Ray, no JAX; no TPU was lent to
this project, so nothing here is a TPU measurement). For each preset and generation:

- the smallest common slice (:func:`raytpu.catalog.common_shapes`) whose HBM holds the preset with
  FSDP over all its chips and one ``seq_len`` sequence per chip, and the memory per chip;
- training FLOPs per token (6 x matmul params + causal attention) and the tokens/s per chip the
  catalog's peak bf16 FLOP/s would allow at 100 % MFU;
- **MFU estimate** (an upper bound, labelled so): with full rematerialisation (what the memory
  estimate assumes) the chip computes the forward twice, so it executes 8 FLOPs for every 6 the
  MFU formula counts (4/3 x for the layer matmuls; the output head is not recomputed); the
  estimate is the model FLOPs over those executed FLOPs at the catalog's peak;
- next to it **MaxText's published MFU** for the generation (the model and source named), and the
  tokens/s per chip our preset would reach at that MFU.

    python -m bench.presets
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bench import _common
from raytpu import catalog, generations
from raytpu.presets import PRESETS, MeshConfig, Preset, PresetError, check_fits

MAXTEXT_MFU: dict[str, tuple[float, str]] = {
    "v6e": (
        0.4546,
        "Llama 3.1 8B, 256 chips, SL 8192 (MaxText docs/reference/models/tiering.md)",
    ),
    "v5p": (0.654, "Llama 2 70B, 512 chips, SL 4096 (MaxText tiering.md)"),
    "v5e": (0.57, "Llama 2 70B, v5e-256 (MaxText getting_started/Run_Llama2.md)"),
    "v4": (0.57, "Llama 2 70B, v4-128 (MaxText getting_started/Run_Llama2.md)"),
}
"""MaxText's published training MFU per generation (bf16); none found for tpu7x."""


def smallest_fit(model: Preset, generation: str) -> tuple[catalog.SliceShape, Any] | None:
    """The smallest common slice of ``generation`` that holds ``model`` under FSDP."""
    shapes = sorted(
        (s for s in catalog.common_shapes() if s.generation.name == generation),
        key=lambda s: (s.chips, -s.chips_per_host),
    )
    for shape in shapes:
        try:
            return shape, check_fits(model, shape, MeshConfig(ici_fsdp=shape.chips))
        except PresetError:
            continue
    return None


def executed_flops_per_token(model: Preset) -> float:
    """FLOPs the chip executes per token with full rematerialisation: the layers' forward
    (2 x layer matmul params + attention) once more on top of the model FLOPs."""
    layer_matmul = model.matmul_params - model.vocab_size * model.d_model
    recompute = 2.0 * layer_matmul + 2.0 * model.n_layers * model.seq_len * model.d_model
    return model.train_flops_per_token() + recompute


def run(presets: Sequence[str]) -> dict[str, Any]:
    rows = []
    for name in presets:
        model = PRESETS[name]
        for gen in generations.GENERATIONS.values():
            fit = smallest_fit(model, gen.name)
            flops = model.train_flops_per_token()
            peak = gen.peak_bf16_tflops * 1e12
            published = MAXTEXT_MFU.get(gen.name)
            rows.append(
                {
                    "preset": name,
                    "params": model.params,
                    "generation": gen.name,
                    "slice": fit[0].name if fit else None,
                    "memoryGiB": fit[1].total_bytes / 2**30 if fit else None,
                    "flopsPerToken": flops,
                    "tokensPerChipAtPeak": peak / flops,
                    "mfuEstimate": flops / executed_flops_per_token(model),
                    "maxtextMfu": published[0] if published else None,
                    "maxtextSource": published[1] if published else None,
                    "tokensPerChipAtMaxtextMfu": published[0] * peak / flops if published else None,
                }
            )
    return {"rows": rows}


def print_report(result: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    return _common.print_table(
        "Presets per TPU generation (arithmetic, not measured: no TPU); FSDP over the slice, "
        "one sequence per chip",
        (
            "preset",
            "generation",
            "smallest slice",
            "GiB/chip",
            "GFLOP/token",
            "tok/s/chip @100%",
            "MFU estimate (bound)",
            "MaxText MFU",
            "tok/s/chip @MaxText MFU",
        ),
        [
            (
                r["preset"],
                r["generation"],
                r["slice"] or "none fits",
                "-" if r["memoryGiB"] is None else f"{r['memoryGiB']:.1f}",
                f"{r['flopsPerToken'] / 1e9:.1f}",
                f"{r['tokensPerChipAtPeak']:,.0f}",
                pct(r["mfuEstimate"]),
                pct(r["maxtextMfu"]),
                "-"
                if r["tokensPerChipAtMaxtextMfu"] is None
                else f"{r['tokensPerChipAtMaxtextMfu']:,.0f}",
            )
            for r in result["rows"]
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.presets", description=__doc__)
    parser.add_argument("--presets", nargs="+", default=["1b", "8b"], choices=sorted(PRESETS))
    args = parser.parse_args(argv)
    result = run(args.presets)
    print_report(result)
    for gen, (mfu, source) in MAXTEXT_MFU.items():
        print(f"MaxText {gen}: {mfu:.1%}, {source}")
    _common.write_results("presets", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
