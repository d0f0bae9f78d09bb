"""Parameter counts, FLOPs per token in two accountings, device peaks and MFU.

Honest accounting (nanoGPT / PaLM appendix B): each token costs 6 FLOPs per weight it meets in
forward+backward, the tied LM head included (it is a d_model x vocab matmul even though it shares
storage with the embedding lookup, which costs nothing), plus attention's score and value matmuls,
12 * n_layer * n_head * head_dim * seq_len. The lab's figure is 6 x non-embedding parameters, about half
the honest one for the lab model: it understates MFU at a measured tokens/s (it counts less work per token)
and, used to plan, overstates the tokens/s a given MFU buys. It is shown beside the honest one, labelled
(see docs/architecture.md and docs/errata.md, 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.config import ModelConfig

# Dense bf16 tensor-core peaks in TFLOP/s (no sparsity), from the vendors' data sheets, per product variant:
# an H100 PCIe (756) is not an H100 SXM (989), so a name that does not say which variant is not guessed.
PEAK_TFLOPS_BF16: dict[str, float] = {
    "a100": 312.0,  # SXM4 and PCIe, 40 and 80 GB alike
    "h100 sxm": 989.0,
    "h100 pcie": 756.0,
    "h100 nvl": 835.0,
    "h200": 989.0,  # H200 SXM and GH200
    "h800 sxm": 989.0,
    "h800 pcie": 756.0,
    "a10g": 125.0,
    "l4": 121.0,
    "l40s": 362.0,
    "rtx 4090": 165.2,
    "rtx 3090": 71.0,
    "v100": 125.0,  # fp16 tensor cores; no bf16
}

# How torch.cuda.get_device_name() spells each variant: (every one of these words in the lower-cased name) ->
# table key, first match wins. "NVIDIA H100 80GB HBM3" is the SXM part; "NVIDIA H100 PCIe" and "NVIDIA H100
# NVL" say so.
_DEVICE_NAMES: list[tuple[tuple[str, ...], str]] = [
    (("h100", "nvl"), "h100 nvl"),
    (("h100", "pcie"), "h100 pcie"),
    (("h100", "hbm3"), "h100 sxm"),
    (("h100", "sxm"), "h100 sxm"),
    (("h800", "pcie"), "h800 pcie"),
    (("h800", "hbm3"), "h800 sxm"),
    (("h800", "sxm"), "h800 sxm"),
    (("h200",), "h200"),
    (("a100",), "a100"),
    (("a10g",), "a10g"),
    (("l40s",), "l40s"),
    (("l4",), "l4"),
    (("4090",), "rtx 4090"),
    (("3090",), "rtx 3090"),
    (("v100",), "v100"),
]


def device_peak(device_name: str | None) -> tuple[float | None, str]:
    """(bf16 peak, how it was decided) for a device name; None with the reason when the table cannot say."""
    if not device_name:
        return None, "no device name"
    name = device_name.lower()
    for words, key in _DEVICE_NAMES:
        if all(w in name for w in words):
            return PEAK_TFLOPS_BF16[key], f"{device_name!r} is the {key.upper()} ({PEAK_TFLOPS_BF16[key]:g} TFLOP/s)"
    family = next((f for f in ("h100", "h800") if f in name), None)
    if family:
        return None, (
            f"{device_name!r} is an {family.upper()} whose variant (SXM, PCIe, NVL) the name does not "
            "say; pass --peak-tflops (989 SXM, 756 PCIe, 835 NVL)"
        )
    return None, f"{device_name!r} is not in the peak table; pass --peak-tflops"


@dataclass(frozen=True)
class ParamCounts:
    non_embedding: int  # weight matrices of the blocks (the Chinchilla convention's N)
    embedding: int  # token embedding (= the LM head when tied)
    lm_head: int  # a separate LM head's weights; 0 when tied
    norm_gains: int  # RMSNorm weights (tiny; not in either convention's N)

    @property
    def total(self) -> int:
        """Matrices + embedding: the lab's "total ~89M" (norm gains excluded, as the lab does)."""
        return self.non_embedding + self.embedding + self.lm_head

    @property
    def all_tensors(self) -> int:
        """Every element the model holds (what ``sum(p.numel())`` gives)."""
        return self.total + self.norm_gains


def param_counts(m: ModelConfig) -> ParamCounts:
    kv = m.n_kv_head * m.head_dim
    attn = 2 * m.d_model * m.d_model + 2 * m.d_model * kv  # q, o ; k, v
    mlp = 3 * m.d_model * m.d_ff  # gate, up, down
    embedding = m.vocab_size * m.d_model
    return ParamCounts(
        non_embedding=m.n_layer * (attn + mlp),
        embedding=embedding,
        lm_head=0 if m.tie_embeddings else embedding,
        norm_gains=(2 * m.n_layer + 1) * m.d_model,
    )


@dataclass(frozen=True)
class FlopsPerToken:
    matmul_non_embedding: int
    lm_head: int
    attention: int

    @property
    def honest(self) -> int:
        return self.matmul_non_embedding + self.lm_head + self.attention

    @property
    def lab_6n(self) -> int:
        return self.matmul_non_embedding


def flops_per_token(m: ModelConfig) -> FlopsPerToken:
    return FlopsPerToken(
        matmul_non_embedding=6 * param_counts(m).non_embedding,
        lm_head=6 * m.d_model * m.vocab_size,
        attention=12 * m.n_layer * m.n_head * m.head_dim * m.seq_len,
    )


def peak_tflops(device_name: str | None, override: float | None = None) -> float | None:
    """bf16 peak of a device by its exact name (``NVIDIA H100 PCIe`` → 756), the override, or None."""
    if override is not None:
        return override
    return device_peak(device_name)[0]


def mfu(tokens_per_s: float, flops_per_tok: int, peak_tflops_per_device: float | None, n_devices: int = 1) -> float:
    """Model FLOPs utilisation; NaN when the peak is unknown (a CPU has no meaningful table entry)."""
    if not peak_tflops_per_device:
        return float("nan")
    return tokens_per_s * flops_per_tok / (peak_tflops_per_device * 1e12 * n_devices)


def describe(m: ModelConfig, device_name: str | None = None, peak_override: float | None = None) -> str:
    c = param_counts(m)
    f = flops_per_token(m)
    peak = peak_tflops(device_name, peak_override)
    lines = [
        f"parameters: {c.non_embedding:,} non-embedding + {c.embedding:,} embedding (tied LM head) = "
        f"{c.total:,} (+{c.norm_gains:,} norm gains)",
        f"FLOPs/token: {f.honest:.3e} honest (6N {f.matmul_non_embedding:.3e} + LM head {f.lm_head:.3e} + "
        f"attention {f.attention:.3e}); lab's 6N figure {f.lab_6n:.3e}",
    ]
    if peak:
        tps = 0.48 * peak * 1e12 / f.honest
        lines.append(f"peak {peak:g} TFLOP/s bf16: MFU 0.48 means {tps:,.0f} tokens/s (honest accounting)")
    else:
        why = device_peak(device_name)[1] if device_name else "this device has no listed peak"
        lines.append(f"peak: unknown ({why}; MFU not reported until --peak-tflops sets it)")
    return "\n".join(lines)
