from __future__ import annotations

import math

from x1_pretrain.core.config import Config, ModelConfig
from x1_pretrain.model.flops import describe, device_peak, flops_per_token, mfu, param_counts, peak_tflops


def test_lab_parameter_counts_without_allocating():
    c = param_counts(Config().model)
    assert c.non_embedding == 50_331_648
    assert c.embedding == 38_597_376
    assert c.total == 88_929_024
    assert c.norm_gains == (2 * 8 + 1) * 768


def test_counts_match_a_real_model():
    """The counts are those of the saved weights (what a user downloads): the vocabulary padding inside the
    model holds 128-multiple rows, of which only vocab_size are weights; the padding is counted apart."""
    from x1_pretrain.model.transformer import Transformer, padded_vocab, state_dict_for_saving

    m = ModelConfig(n_layer=3, d_model=48, n_head=6, n_kv_head=2, d_ff=80, seq_len=16, vocab_size=500)
    model = Transformer(m)
    assert sum(t.numel() for t in state_dict_for_saving(model).values()) == param_counts(m).all_tensors
    padding = (padded_vocab(m) - m.vocab_size) * m.d_model
    assert padding == 12 * 48  # 500 -> 512 rows
    assert sum(p.numel() for p in model.parameters()) == param_counts(m).all_tensors + padding
    for fused in (False, True):
        untied = ModelConfig(
            n_layer=1,
            d_model=16,
            n_head=2,
            n_kv_head=1,
            d_ff=32,
            seq_len=8,
            vocab_size=50,
            tie_embeddings=False,
            vocab_pad_multiple=1,
            fused_projections=fused,
        )
        assert sum(p.numel() for p in Transformer(untied).parameters()) == param_counts(untied).all_tensors


def test_flops_match_the_errata():
    f = flops_per_token(Config().model)
    assert f.honest == 609_071_616  # ≈ 6.09e8 (ERRATA 1)
    assert f.lab_6n == 6 * 50_331_648
    tps = 0.48 * 312e12 / f.honest
    assert round(tps / 1000) == 246  # ≈ 246k tokens/s on an A100 at MFU 0.48
    assert round(0.48 * 989e12 / f.honest / 1000) == 779
    assert math.isclose(mfu(tps, f.honest, 312.0), 0.48)


def test_peak_table_and_override():
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # what torch calls the SXM part
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0 and peak_tflops("NVIDIA H100 NVL") == 835.0
    assert peak_tflops("NVIDIA H200") == 989.0 and peak_tflops("NVIDIA GH200 480GB") == 989.0
    assert peak_tflops("NVIDIA L40S") == 362.0 and peak_tflops("NVIDIA L4") == 121.0
    peak, why = device_peak("NVIDIA H100")  # which H100? the name does not say
    assert peak is None and "989 SXM, 756 PCIe, 835 NVL" in why
    assert device_peak("Some Future GPU")[0] is None and "not in the peak table" in device_peak("Some Future GPU")[1]
    assert peak_tflops("cpu") is None
    assert peak_tflops("whatever", 100.0) == 100.0
    assert math.isnan(mfu(1000.0, 10, None))
    text = describe(Config().model, "NVIDIA A100-SXM4-80GB")
    assert "88,929,024" in text and "6N" in text and "245,882" in text
