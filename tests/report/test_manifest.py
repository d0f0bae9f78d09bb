"""The manifest's evals section: the latest evaluation's scores per task, with the protocol."""

from __future__ import annotations

from x1_pretrain.evals.registry import TASKS
from x1_pretrain.report.manifest import _evals
from x1_pretrain.report.runs import MetricPoint


def test_the_latest_scores_of_each_task_with_items_scored_the_limit_asked_the_split_and_hashes():
    points = [
        MetricPoint("eval/piqa/acc", 100, 0.55, 0),
        MetricPoint("eval/piqa/acc_norm", 100, 0.56, 0),
        MetricPoint("eval/piqa/n", 100, 500, 0),
        MetricPoint("eval/piqa/acc", 200, 0.60, 0),
        MetricPoint("eval/piqa/acc_norm", 200, 0.61, 0),
        MetricPoint("eval/piqa/n", 200, 497, 0),  # 3 items skipped: n is what was scored, not the limit
        MetricPoint("eval/winogrande/acc", 200, 0.52, 0),
        MetricPoint("eval/winogrande/n", 200, 500, 0),
        MetricPoint("train/loss", 200, 3.3, 0),
    ]
    got = _evals(points, {"train": {"eval_tasks_limit": 500}})
    assert got is not None and got["limit"] == 500
    assert got["tasks"]["piqa"] == {
        "step": 200,
        "acc": 0.60,
        "acc_norm": 0.61,
        "n": 497,
        "limit": 500,
        "split": "validation",
        "data_sha256": TASKS["piqa"].sha256,
    }
    assert got["tasks"]["winogrande"]["acc_norm"] is None and got["tasks"]["winogrande"]["n"] == 500
    assert isinstance(got["tasks"]["piqa"]["n"], int)
    assert _evals([MetricPoint("train/loss", 1, 3.0, 0)], {}) is None
    # a run that did not record what it scored: the count is unknown, never the limit or the set's size
    old = [p for p in points if not p.name.endswith("/n")]
    assert _evals(old, {"train": {}})["tasks"]["piqa"]["n"] is None
