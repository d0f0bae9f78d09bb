"""The MLflow tracker against a server that never answers, and the spill it leaves for the resume."""

from __future__ import annotations

import time

from x1_pretrain.trainer.tracking import SPILL_PREFIX, MlflowTracker

from ..conftest import seed_store
from ..servers import SilentServer


def test_a_silent_server_costs_the_close_its_timeout_and_the_resume_delivers_the_spill(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    monkeypatch.setenv("X1_MLFLOW_START_TIMEOUT_S", "0.5")
    silent = SilentServer()
    try:
        t0 = time.monotonic()
        dead = MlflowTracker(silent.url, None, "r")
        assert time.monotonic() - t0 < 5 and not dead.reachable
        for step in range(1, 11):
            dead.log_metrics(step, {"train/loss": 10.0 - step})
        t0 = time.monotonic()
        dead.close("KILLED", timeout_s=2.0, spill_dir=tmp_path)
        assert time.monotonic() - t0 < 4.0  # bounded, although every request would wait 60 s
    finally:
        silent.close()
    (spill,) = tmp_path.glob(f"{SPILL_PREFIX}*.jsonl")
    assert len(spill.read_text().splitlines()) == 10

    seed_store(tmp_path / "c")
    live = MlflowTracker(f"sqlite:///{tmp_path / 'c' / 'mlflow.db'}", None, "r")
    assert live.redeliver(tmp_path, up_to_step=7) == 7  # steps 8-10 are replayed by the resumed run itself
    live.close("FINISHED", timeout_s=30.0, spill_dir=tmp_path)
    assert not list(tmp_path.glob(f"{SPILL_PREFIX}*"))
    hist = live._client.get_metric_history(live.run_id, "train/loss")
    assert {m.step: m.value for m in hist} == {s: 10.0 - s for s in range(1, 8)}
