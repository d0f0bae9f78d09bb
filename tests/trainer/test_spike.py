from __future__ import annotations

import random
import signal

import numpy as np
import torch

from x1_pretrain import train
from x1_pretrain.core import safetensors_io
from x1_pretrain.data.tokens import Batch
from x1_pretrain.trainer.loop import StepReport, Throughput
from x1_pretrain.trainer.spike import (
    SpikeDetector,
    SpikeInjector,
    SpikeReport,
    SpikeSchedule,
    SpikeWatch,
    rare_token_distribution,
    unigram_counts,
)

from ..conftest import FAST, TINY
from ..procs import progress_step, run_info, start, train_cmd, train_here, wait_for


def test_rare_tokens_are_the_bottom_percent_weighted_by_inverse_count():
    counts = np.zeros(1000, dtype=np.int64)
    counts[:900] = np.arange(1, 901)  # token i seen i+1 times; 900..999 never seen
    counts[999] = 5  # pretend 999 is EOT
    ids, p = rare_token_distribution(counts, eot_id=999)
    assert ids.tolist() == list(range(10))  # 1% of 1000 types, the rarest seen ones
    np.testing.assert_allclose(p, (1 / np.arange(1, 11)) / (1 / np.arange(1, 11)).sum())


def test_unigram_counts_are_computed_and_cached_when_absent(tmp_path):
    tokens = np.array([1, 2, 2, 3, 3, 3], dtype=np.uint16)
    counts = unigram_counts(tmp_path, tokens, 10, log=lambda m: None)
    assert counts.tolist() == [0, 1, 2, 3, 0, 0, 0, 0, 0, 0]
    assert np.load(tmp_path / "unigram_counts.npy").tolist() == counts.tolist()


def test_injected_batches_are_a_pure_function_of_seed_step_chunk():
    ids, p = np.arange(5, 15), np.full(10, 0.1)
    a = SpikeInjector(SpikeSchedule(10, 3), ids, p, seed=42)
    b = SpikeInjector(SpikeSchedule(10, 3), ids, p, seed=42)
    assert [s + 1 for s in range(20) if a.active(s)] == [10, 11, 12]
    x1, _ = a.batch(10, 1, 4, 8)
    x2, _ = b.batch(10, 1, 4, 8)
    assert torch.equal(x1, x2) and not torch.equal(x1, a.batch(11, 1, 4, 8)[0])
    assert set(x1.flatten().tolist()) <= set(ids.tolist())
    data = Batch(3, 0, torch.zeros(4, 8, dtype=torch.long), torch.zeros(4, 8, dtype=torch.long))
    assert a.replace(3, 0, data) is data
    a.cancelled = "natural spike"
    assert not a.active(10)


def noisy_curve(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [4 + 6 * np.exp(-i / 40) + rng.gauss(0, 0.15) for i in range(n)]


def test_detector_flags_jumps_and_nothing_on_a_clean_falling_curve():
    d = SpikeDetector()
    flagged = [s for s, loss in enumerate(noisy_curve(400), 1) if d.observe(s, loss, 1.0 + 0.1 * random.random(), 1.0)]
    assert flagged == []
    d = SpikeDetector()
    curve = noisy_curve(200)
    for s in range(100, 103):
        curve[s] += 4.0
    events = [d.observe(s + 1, loss, 1.0, 1.0) for s, loss in enumerate(curve)]
    assert [e.step for e in events if e] == [101, 102, 103]
    e = events[100]
    assert e.by == "loss" and e.loss - e.baseline > 3.0 and not e.clipped
    d2 = SpikeDetector()
    hits = [d2.observe(s, 5.0, 20.0 if s == 60 else 1.0, 1.0) for s in range(1, 80)]
    assert [h.step for h in hits if h] == [60] and hits[59].by == "grad_norm" and hits[59].clipped


def test_detector_accepts_a_new_level_after_a_long_run_of_flags():
    d = SpikeDetector(grad_window=10)
    for s in range(1, 40):
        d.observe(s, 3.0, 1.0, 1.0)
    flags = [d.observe(s, 9.0, 1.0, 1.0) is not None for s in range(40, 80)]
    assert flags[:10] == [True] * 10 and not any(flags[11:])


class _At:
    step = 0


def watch_over(curve: list[tuple[float, float]], warmup: int, force: bool = False):
    """A SpikeWatch with an injection planned at step 100, fed (loss, grad norm) for steps 1, 2, ..."""
    logs, tags = [], []
    inj = SpikeInjector(SpikeSchedule(100, 5), np.arange(3), np.full(3, 1 / 3), 0)
    watch = SpikeWatch(
        SpikeDetector(baseline_steps=5),
        inj,
        False,
        force,
        SpikeReport(logs.append, lambda s, m: None, tags.append),
        lr_warmup_steps=warmup,
    )
    for s, (loss, gn) in enumerate(curve, start=1):
        assert watch.before_update(s - 1, loss, gn, 1.0) is False  # detection only: no update is skipped
        _At.step = s
        report = StepReport(
            s, 0.1, {"train/loss": loss, "train/grad_norm": gn, "train/lr": 1e-3}, Throughput(1), logged=True
        )
        watch.after_step(None, _At, report)
    return inj, logs, tags


def test_a_natural_loss_spike_after_the_warmup_cancels_the_injection_unless_forced():
    curve = [(10.0 if s == 20 else 3.0, 1.0) for s in range(1, 30)]
    for force in (False, True):
        inj, logs, tags = watch_over(curve, warmup=10, force=force)
        assert (inj.cancelled is None) == force
    inj, logs, tags = watch_over(curve, warmup=10)
    assert any("injection skipped: a natural loss spike came first (step 20" in m for m in logs)
    assert tags == [{"spike_injection_skipped": "natural loss spike at step 20 before step 100"}]


def test_a_grad_norm_blip_or_a_spike_inside_the_warmup_keeps_the_injection():
    blip = [(3.0, 40.0 if s == 20 else 1.0) for s in range(1, 30)]  # the loss never moves
    inj, logs, tags = watch_over(blip, warmup=10)
    assert inj.cancelled is None and tags == []
    assert any("spike injection kept: the detection at step 20 is grad norm only" in m for m in logs)
    early = [(10.0 if s == 20 else 3.0, 1.0) for s in range(1, 30)]  # a loss jump during a long warm-up
    inj, logs, tags = watch_over(early, warmup=25)
    assert inj.cancelled is None and tags == []
    assert any("is during the LR warm-up (step <= 25)" in m for m in logs)


def metric(ckpt, key):
    client, runs = run_info(ckpt)
    return {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, key)}


def test_injected_run_jumps_at_exactly_those_steps_is_detected_and_recovers(spiked_run):
    injected = metric(spiked_run, "spike/injected")
    assert sorted(injected) == [40, 41, 42, 43, 44]
    loss = metric(spiked_run, "train/loss")
    assert set(range(25, 60)) <= set(loss)  # dense logging around the spike despite --log-every 20
    before = max(loss[s] for s in range(25, 40))
    assert all(loss[s] > before + 2.0 for s in range(40, 45))
    assert loss[59] < before + 1.0  # recovered
    detected = metric(spiked_run, "spike/detected")
    assert {40, 41, 42, 43, 44} <= set(detected) and min(detected) == 40
    _, runs = run_info(spiked_run)
    assert runs[0].data.tags["spike_injection"].startswith("steps 40..44")


def test_the_same_run_without_an_injection_has_no_spike(clean_run):
    """The control of the test above (its own fixture, so the two runs build on two workers at once)."""
    assert metric(clean_run, "spike/detected") == {}
    assert len(metric(clean_run, "train/loss")) >= 3 and metric(clean_run, "spike/injected") == {}


def test_skip_spike_steps_skips_the_updates(demo_data, tmp_path):
    assert (
        train.main(
            [
                "--config",
                str(TINY),
                "--data-dir",
                str(demo_data),
                "--total-steps",
                "30",
                *FAST,
                "--ckpt-dir",
                str(tmp_path / "c"),
                "--inject-spike-at-step",
                "25",
                "--spike-batches",
                "2",
                "--spike-skip-steps",
            ]
        )
        == 0
    )
    assert metric(tmp_path / "c", "spike/update_skipped") == {25: 1.0, 26: 1.0}


def test_resuming_inside_the_injection_window_replays_the_same_batches(demo_data, tmp_path, capsys):
    """Run A straight (in this process); run B a real process stopped by SIGTERM inside the injection window,
    resumed in this process: the same final weights and the same losses over the window and after."""
    # early in the run: the detector (20 warm-up steps) cannot call a natural spike before it, so the
    # injection is never cancelled, and the replay of the injected batches is what is under test
    spike = [
        "--inject-spike-at-step",
        "8",
        "--spike-batches",
        "6",
        "--set",
        "checkpoint.async_save=false",
        # a quarter of the FAST batch (grad accumulation still 2): the replay does not depend on its size
        "--set",
        "train.batch_size=4",
        "--set",
        "train.micro_batch_size=2",
        "--set",
        "train.grad_accum_steps=2",
    ]
    a = tmp_path / "a"
    assert train_here(train_cmd(demo_data, a, 16, *spike)) == 0
    b = tmp_path / "b"
    proc = start(train_cmd(demo_data, b, 16, *spike), tmp_path / "b.log")
    stop_at = random.randint(8, 9)  # the stop lands a step or two later: still inside the window (< 13)
    wait_for(lambda: progress_step(b) >= stop_at, proc=proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    capsys.readouterr()
    code = train_here(train_cmd(demo_data, b, 16, *spike, "--resume-from-latest"))
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    resumed_at = int(out.split("at step ")[1].split()[0])
    assert 8 <= resumed_at < 13, "the resume point is inside the injection window"
    fa, fb = safetensors_io.load(a / "final.safetensors"), safetensors_io.load(b / "final.safetensors")
    assert all(torch.equal(fa[k], fb[k]) for k in fa)
    la, lb = metric(a, "train/loss"), metric(b, "train/loss")
    assert all(la[s] == lb[s] for s in range(8, 17))
