from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.conftest import TINY
from x1_pretrain.core.errors import DataError
from x1_pretrain.data.tokens import Prefetcher, Sampler, gather, open_token_data, val_starts


def test_batch_is_a_pure_function_of_seed_step_chunk():
    a = Sampler(100_001, 100, seed=42, micro_batch_size=4, chunks_per_step=3)
    b = Sampler(100_001, 100, seed=42, micro_batch_size=4, chunks_per_step=3)
    # b is asked out of order (as a resumed run would), yet gives the same windows
    later = b.starts(500, 2)
    assert np.array_equal(a.starts(7, 1), b.starts(7, 1))
    assert np.array_equal(a.starts(500, 2), later)
    assert not np.array_equal(a.starts(7, 1), Sampler(100_001, 100, 43, 4, 3).starts(7, 1))


def test_every_window_once_per_epoch_then_reshuffled():
    s = Sampler(1001, 10, seed=1, micro_batch_size=5, chunks_per_step=2)  # 100 windows, 10 per step
    first = np.concatenate([s.starts(step, c) for step in range(10) for c in range(2)])
    assert sorted(first.tolist()) == list(range(0, 1000, 10))
    second = np.concatenate([s.starts(step, c) for step in range(10, 20) for c in range(2)])
    assert sorted(second.tolist()) == sorted(first.tolist())
    assert not np.array_equal(first, second)
    assert s.epoch_of(10) == 1.0


def test_windows_cross_an_epoch_boundary_inside_a_batch():
    s = Sampler(71, 10, seed=0, micro_batch_size=4, chunks_per_step=1)  # 7 windows
    starts = s.starts(1, 0)  # global samples 4..7: three of epoch 0, one of epoch 1
    assert np.array_equal(starts[:3], s.permutation(0)[4:7] * 10)
    assert starts[3] == s.permutation(1)[0] * 10


def test_gather_targets_are_inputs_shifted():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = gather(tokens, np.array([0, 500]), 16)
    assert x.shape == (2, 16) and x.dtype.is_floating_point is False
    assert x[1, 0].item() == 500 and y[1, -1].item() == 516
    assert (y[:, :-1] == x[:, 1:]).all()


def test_val_windows_are_fixed_and_spread():
    a = val_starts(10_001, 100, 5)
    assert np.array_equal(a, val_starts(10_001, 100, 5))
    assert a[0] == 0 and a[-1] == 9900


def test_prefetcher_yields_in_order_and_propagates_errors():
    tokens = np.arange(5000, dtype=np.uint16) % 50
    s = Sampler(tokens.size, 8, 0, 2, 2)
    p = Prefetcher(tokens, s, [0, 1], 3, 6, depth=2, pin=False)
    got = [(b.step, b.chunk) for b in p]
    assert got == [(st, c) for st in range(3, 6) for c in (0, 1)]
    bad = Prefetcher(tokens, Sampler(tokens.size, 8, 0, 2, 2), [0], 0, 10**9, depth=1, pin=False)
    bad._sampler = None  # type: ignore[assignment]  # force an error inside the thread
    with pytest.raises(AttributeError):
        list(bad)


def test_validation_names_file_and_numbers(demo_data, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(demo_data, d)
    assert open_token_data(d, 50257, 64).train.size > 0
    # a model too small for the data's tokenizer: both numbers and the fix, before any index error
    too_small = r"model\.vocab_size 32,000 is smaller .* 50,257 \(its largest id in the bins: 50,256\)[\s\S]*: auto"
    with pytest.raises(DataError, match=too_small):
        open_token_data(d, 32000, 64)
    with pytest.raises(DataError, match=r"vocab_size 50257 does not match model\.vocab_size 60000"):
        open_token_data(d, 60000, 64)
    with open(d / "val.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(DataError, match="not a whole number of uint16 tokens"):
        open_token_data(d, 50257, 64)
    shutil.copy(demo_data / "val.bin", d / "val.bin")
    with open(d / "train.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(DataError, match=r"meta\.json says"):
        open_token_data(d, 50257, 64)
    shutil.copy(demo_data / "train.bin", d / "train.bin")
    ids = np.fromfile(d / "train.bin", dtype=np.uint16)
    ids[100] = 60000
    ids.tofile(d / "train.bin")
    with pytest.raises(
        DataError,
        match=r"train\.bin: token id 60000 at token offset 100 \(byte 200\) is out of "
        r"range for model\.vocab_size 50257",
    ):
        open_token_data(d, 50257, 64)
    (d / "meta.json").unlink()
    with pytest.raises(DataError, match="not a finished tokenize_data output"):
        open_token_data(d, 50257, 64)
    with pytest.raises(DataError, match="does not exist"):
        open_token_data(tmp_path / "nope", 50257, 64)


def test_too_little_val_data_says_what_to_do(demo_data, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(demo_data, d)
    np.array([1, 2, 50256], dtype=np.uint16).tofile(d / "val.bin")
    meta = json.loads((d / "meta.json").read_text())
    meta["splits"]["val"]["tokens"] = 3
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="larger --val-fraction"):
        open_token_data(d, 50257, 64)


def test_missing_eot_is_flagged(demo_data, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(demo_data, d)
    ids = np.fromfile(d / "val.bin", dtype=np.uint16)
    ids[ids == 50256] = 13
    ids.tofile(d / "val.bin")
    with pytest.raises(DataError, match="no end-of-text token"):
        open_token_data(d, 50257, 64)


def test_every_id_is_checked_once_and_the_result_is_kept_in_meta_json(demo_data, tmp_path, monkeypatch):
    from x1_pretrain.data import tokens as T

    d = tmp_path / "d"
    shutil.copytree(demo_data, d)  # copy2: size and mtime kept, so tokenize_data's record still holds
    meta = json.loads((d / "meta.json").read_text())
    assert meta["validated"]["train"]["max_id"] == meta["splits"]["train"]["max_id"] < 50257
    scans: list[str] = []
    real_scan = T.scan_max_id
    monkeypatch.setattr(T, "scan_max_id", lambda t, p, v: scans.append(p.name) or real_scan(t, p, v))
    open_token_data(d, 50257, 64)
    assert scans == []  # the record written by tokenize_data is trusted for these exact files

    # One bad id far past the 64 sampled slices of 16,384 tokens: only a full scan finds it.
    monkeypatch.setattr(T, "_SAMPLE_SLICES", 2)
    monkeypatch.setattr(T, "_SAMPLE_LEN", 64)
    monkeypatch.setattr(T, "_SCAN_CHUNK", 4096)  # several chunks, so the offset is computed across them
    ids = np.fromfile(d / "train.bin", dtype=np.uint16)
    at = ids.size // 2 + 12345
    ids[at] = 50300
    ids.tofile(d / "train.bin")
    with pytest.raises(DataError) as e:
        open_token_data(d, 50257, 64)
    assert f"train.bin: token id 50300 at token offset {at:,}" in str(e.value) and "50257" in str(e.value)
    assert scans == ["train.bin"]

    ids[at] = 7
    ids.tofile(d / "train.bin")  # a rewrite changes size or mtime: scanned again, then recorded
    open_token_data(d, 50257, 64)
    open_token_data(d, 50257, 64)
    assert scans == ["train.bin", "train.bin"]
    rec = json.loads((d / "meta.json").read_text())["validated"]["train"]
    assert rec["max_id"] == int(ids.max()) and rec["bytes"] == ids.size * 2


def test_a_bad_id_stops_the_trainer_before_any_step_naming_the_file(demo_data, tmp_path, capsys):
    from x1_pretrain import train

    d = tmp_path / "d"
    shutil.copytree(demo_data, d)
    ids = np.fromfile(d / "val.bin", dtype=np.uint16)
    ids[-3] = 65535
    ids.tofile(d / "val.bin")
    code = train.main(["--config", str(TINY), "--data-dir", str(d), "--ckpt-dir", str(tmp_path / "c"), "--no-compile"])
    err = capsys.readouterr()
    assert code == 2 and f"val.bin: token id 65535 at token offset {ids.size - 3:,}" in err.err
    assert "step " not in err.out and not (tmp_path / "c" / "mlflow.db").exists()
