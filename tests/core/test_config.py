from __future__ import annotations

from pathlib import Path

import pytest

from x1_pretrain.core import config as C

from ..conftest import REPO


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_lab_config_holds_the_labs_numbers():
    cfg = C.load(REPO / "configs" / "x1-50m-a100.yaml")
    m, o, t = cfg.model, cfg.optim, cfg.train
    assert (m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.d_ff, m.seq_len, m.vocab_size) == (
        8,
        768,
        12,
        4,
        2048,
        1024,
        50257,
    )
    assert (m.norm, m.activation, m.pos_enc, m.rope_base, m.init_std, m.tie_embeddings) == (
        "rmsnorm",
        "swiglu",
        "rope",
        10000.0,
        0.02,
        True,
    )
    assert (o.lr, o.min_lr, o.beta1, o.beta2, o.weight_decay, o.grad_clip, o.warmup_steps, o.schedule) == (
        3e-4,
        3e-5,
        0.9,
        0.95,
        0.1,
        1.0,
        1000,
        "cosine",
    )
    assert (t.batch_size, t.micro_batch_size, t.grad_accum_steps, t.seed) == (512, 32, 16, 42)
    assert (t.precision, t.compile, t.compile_mode, t.attention) == ("bf16", True, "max-autotune", "flash")
    assert cfg.tokens_per_step() == 524288
    assert "decay_embedding" in (REPO / "configs" / "x1-50m-a100.yaml").read_text()


def test_all_problems_are_reported_at_once_with_their_keys(tmp_path):
    p = write(
        tmp_path,
        """
model: {d_model: 100, n_head: 12, n_kv_head: 5, n_layr: 3}
optim: {lr: fast}
train: {batch_size: 512, micro_batch_size: 32, grad_accum_steps: 8, total_steps: 0, compile: "yes"}
trian: {}
""",
    )
    with pytest.raises(C.ConfigError) as e:
        C.load(p)
    msg = str(e.value)
    for needle in [
        "model.n_layr: unknown key (did you mean model.n_layer?)",
        "optim.lr: expected a number",
        "train.compile: expected true or false",
        "trian: unknown section (did you mean train?)",
        "model.d_model: 100 is not divisible by model.n_head 12",
        "model.n_head: 12 is not divisible by model.n_kv_head 5",
        "train.total_steps: must be positive",
        "train.grad_accum_steps: 8 disagrees with train.batch_size 512 / train.micro_batch_size 32 = 16",
        str(p),
    ]:
        assert needle in msg, needle


def test_yaml_style_numbers_and_overrides(tmp_path):
    p = write(tmp_path, "optim: {lr: 3e-4}\ntrain: {total_steps: 10}\n")
    cfg = C.load(p, {"train.total_steps": 20}, ["train.total_steps=30", "optim.lr=1e-3", "train.compile=false"])
    assert cfg.optim.lr == 1e-3 and cfg.train.total_steps == 30 and cfg.train.compile is False
    cfg2 = C.load(p, {"train.total_steps": 20})
    assert cfg2.train.total_steps == 20 and cfg2.optim.lr == 3e-4


def test_bad_set_and_bad_literal(tmp_path):
    p = write(tmp_path, "{}")
    with pytest.raises(C.ConfigError) as e:
        C.load(p, sets=["nonsense", "train.precision=fp8"])
    assert "expected section.key=value" in str(e.value)
    with pytest.raises(C.ConfigError) as e:
        C.load(p, sets=["train.precision=fp8"])
    assert "train.precision: 'fp8' is not one of 'bf16', 'fp32'" in str(e.value)


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(C.ConfigError, match="cannot read"):
        C.load(tmp_path / "missing.yaml")
    with pytest.raises(C.ConfigError, match="not valid YAML"):
        C.load(write(tmp_path, "model: [unclosed"))


def test_hash_is_canonical_and_diff_names_keys(tmp_path):
    a = C.load(write(tmp_path, "optim: {lr: 3.0e-4}"))
    b = C.Config()
    assert a.sha256() == b.sha256()
    c = C.load(tmp_path / "c.yaml", sets=["optim.lr=1e-3"])
    assert c.sha256() != a.sha256()
    assert C.diff(a.to_dict(), c.to_dict()) == [("optim.lr", 3e-4, 1e-3)]


def test_configs_are_frozen():
    cfg = C.Config()
    with pytest.raises(AttributeError):
        cfg.train.total_steps = 3  # type: ignore[misc]


def test_grad_accum_is_derived_for_every_rank_count_and_a_disagreeing_value_names_the_three_numbers(tmp_path):
    """grad_accum_steps counts the step's micro-batches over all ranks (batch / micro): the same on 1, 2 or 4
    ranks; a rank count that cannot share them out, or a value that disagrees, is an error that says what fits."""
    assert C.Config().train.grad_accum_steps == 16  # 512 / 32, derived
    for world in (1, 2, 4, 8, 16):
        assert not C.validate(C.Config(), world_size=world)
    (three,) = C.validate(C.Config(), world_size=3)
    assert "16 micro-batches a step cannot be shared out over 3 ranks; run on 1, 2, 4, 8, 16 ranks" in three
    (wrong,) = C.validate(C.Config(train=C.TrainConfig(grad_accum_steps=8)))
    assert (
        wrong.startswith(
            "train.grad_accum_steps: 8 disagrees with train.batch_size 512 / train.micro_batch_size 32 = 16"
        )
        and "set it to 16" in wrong
    )
    lab = REPO / "configs" / "x1-50m-a100.yaml"
    assert C.load(lab, sets=["train.micro_batch_size=16"]).train.grad_accum_steps == 32  # the file's 16 re-derived
    assert C.load(lab, sets=["train.micro_batch_size=16"], world_size=2).train.grad_accum_steps == 32
    with pytest.raises(C.ConfigError, match="disagrees"):
        C.load(lab, sets=["train.micro_batch_size=16", "train.grad_accum_steps=16"])
    with pytest.raises(C.ConfigError, match=r"is not a multiple of train\.micro_batch_size 48"):
        C.load(lab, sets=["train.micro_batch_size=48"])
    p = write(tmp_path, "train: {batch_size: 64, micro_batch_size: 8}\n")
    assert C.load(p).train.grad_accum_steps == 8


def test_the_lab_config_holds_the_labs_budget_and_checkpoint_cadence():
    cfg = C.load(REPO / "configs" / "x1-50m-a100.yaml")
    b = cfg.budget
    assert (b.cap_usd, b.alert_usd, b.buffer_usd, b.reserve_min, b.check_every_min) == (35.0, 30.0, 5.0, 10.0, 30.0)
    assert (b.sidecar_interval_min, b.unknown_grace_min, b.stop_wait_s, b.max_rate_usd_per_hr) == (
        5.0,
        60.0,
        120.0,
        1.4,
    )
    assert (b.fit, b.max_hours) == (False, 24.0)
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.keep_last) == (1800, 3)


def test_every_section_is_keyword_only():
    """Fields share types: a positional swap of two floats would run silently, so it must not compile."""
    for cls in (*C.SECTIONS.values(), C.Config):
        with pytest.raises(TypeError):
            cls(1)


def test_budget_rules_name_the_key_and_the_flag(tmp_path):
    p = write(tmp_path, "budget: {cap_usd: 35, alert_usd: 40, check_every_min: 0, assumed_mfu: 2, fit: true}\n")
    with pytest.raises(C.ConfigError) as e:
        C.load(p)
    text = str(e.value)
    for expected in (
        "budget.alert_usd: 40.0 must be below budget.cap_usd 35.0",
        "(--budget-alert-usd",
        "budget.check_every_min: must be positive",
        "budget.assumed_mfu: must be in (0, 1]",
        "budget.fit: needs optim.schedule 'wsd'",
    ):
        assert expected in text, text


def test_renamed_keys_are_read_for_one_release_with_a_notice(tmp_path, capsys):
    p = write(
        tmp_path,
        "train: {ckpt_every: 7, fit_to_budget: true}\noptim: {schedule: wsd}\n"
        "spike: {warmup_steps: 9, skip_spike_steps: true}\n",
    )
    cfg = C.load(p, sets=["train.ckpt_every_min=15"])
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.every_min, cfg.budget.fit) == (7, 15.0, True)
    assert (cfg.spike.baseline_steps, cfg.spike.skip_steps) == (9, True)
    err = capsys.readouterr().err
    for old, new in C.RENAMED.items():
        assert f"{old} is now {new}" in err
    assert err.count("deprecated") == len(C.RENAMED)
    both = write(tmp_path, "train: {ckpt_every: 7}\ncheckpoint: {every_steps: 8}\n")
    with pytest.raises(C.ConfigError, match=r"train\.ckpt_every: renamed checkpoint\.every_steps, and both are set"):
        C.load(both)


def test_a_checkpoint_written_before_a_rename_compares_equal():
    """A resume reads the config a checkpoint recorded: old key names are the same keys, not changes."""
    new = C.Config().to_dict()
    old = C.Config().to_dict()
    old["train"]["ckpt_every"] = old["checkpoint"].pop("every_steps")
    old["spike"]["warmup_steps"] = old["spike"].pop("baseline_steps")
    del old["budget"]
    diffs = C.diff(old, new)
    assert all(key.startswith("budget.") for key, _, _ in diffs)
    assert all(key in C.OPERATIONAL_KEYS or key == "budget.fit" for key, _, _ in diffs)
    old["checkpoint"]["every_steps"] = 5
    assert ("checkpoint.every_steps", 5, 1800) in C.diff(old, new)


def test_the_remote_wait_is_bounded_and_defaults_to_30_minutes(tmp_path):
    assert C.load(write(tmp_path, "{}\n")).checkpoint.remote_wait_min == 30.0
    assert C.load(write(tmp_path, "{}\n"), {"checkpoint.remote_wait_min": 0}).checkpoint.remote_wait_min == 0
    for bad in (-1, 1441):
        with pytest.raises(C.ConfigError, match=r"checkpoint\.remote_wait_min: must be between 0"):
            C.load(write(tmp_path, f"checkpoint: {{remote_wait_min: {bad}}}\n"))
