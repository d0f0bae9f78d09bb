"""The one logging path: format, streams, levels, and --log-level on a real training run."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timedelta, timezone

from x1_pretrain import train
from x1_pretrain.core import log as x1log

from ..conftest import FAST, TINY
from ..procs import SMALL_BATCH

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR)\s+([a-z_.]+): (.*)$")


def test_one_format_info_to_stdout_warnings_to_stderr_and_the_level_filters(capsys):
    x1log.setup("info")
    loop = logging.getLogger("x1_pretrain.trainer.loop")
    loop.debug("not shown at info")
    loop.info("step 1/2 | loss 1.0")
    say = x1log.as_log(logging.getLogger("x1_pretrain.budget.monitor"))
    say("budget warning: the check failed")
    say("warning: a plain warning")
    say("a plain line")
    out, err = capsys.readouterr()
    assert [LINE.match(x).groups() for x in out.splitlines()] == [
        ("INFO", "trainer.loop", "step 1/2 | loss 1.0"),
        ("INFO", "budget.monitor", "a plain line"),
    ]
    assert [LINE.match(x).groups() for x in err.splitlines()] == [
        ("WARNING", "budget.monitor", "budget warning: the check failed"),
        ("WARNING", "budget.monitor", "a plain warning"),
    ]
    x1log.setup("error")
    loop.warning("hidden at error")
    loop.error("shown at error")
    out, err = capsys.readouterr()
    assert out == "" and [LINE.match(x).group(3) for x in err.splitlines()] == ["shown at error"]
    x1log.setup("debug", info_to="stderr")  # the watchdog's: every line on stderr, the trainer's stdout apart
    loop.debug("now shown")
    out, err = capsys.readouterr()
    assert out == "" and LINE.match(err.strip()).groups() == ("DEBUG", "trainer.loop", "now shown")


def test_a_run_at_warning_level_leaves_out_the_step_lines_and_shows_the_budget_warning(demo_data, tmp_path, capsys):
    """--log-level warning on the lab's train command: no per-step line, no info line at all on stdout, and the
    budget guard's warning (here: a budget.json stamped an hour in the future, ignored as clock skew) on stderr;
    the run itself trains as always (its metrics are all in MLflow)."""
    budget = tmp_path / "budget.json"
    ahead = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    budget.write_text(
        json.dumps(
            {
                "spent_usd": 1.0,
                "rate_usd_per_hr": 1.1,
                "hours_elapsed": 1.0,
                "projected_total_usd": 2.0,
                "fixed_usd": {"disk_usd": 0.0, "egress_usd": 0.0},
                "last_update_utc": ahead,
            }
        )
    )
    ckpt = tmp_path / "c"
    args = ["--config", str(TINY), "--data-dir", str(demo_data), "--ckpt-dir", str(ckpt), "--total-steps", "4"]
    budget_flags = ["--budget-cap-usd", "35", "--budget-curr-cost-uri", str(budget), "--force-launch"]
    code = train.main([*args, "--log-every", "1", *budget_flags, *FAST, *SMALL_BATCH, "--log-level", "warning"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert out == "", out[-3000:]
    lines = [LINE.match(x) for x in err.splitlines() if LINE.match(x)]
    assert lines and {m.group(1) for m in lines} <= {"WARNING", "ERROR"}, err[-3000:]
    assert any("budget warning:" in m.group(3) and "in the future" in m.group(3) for m in lines), err[-3000:]
    assert "step " not in err and "loss" not in err
    from mlflow import MlflowClient

    from x1_pretrain.core.names import default_mlflow_uri

    client = MlflowClient(tracking_uri=default_mlflow_uri(ckpt))
    exp = client.get_experiment_by_name("x1-pretraining")
    (run,) = client.search_runs([exp.experiment_id])
    assert {m.step for m in client.get_metric_history(run.info.run_id, "train/loss")} == {1, 2, 3, 4}
    # the same command at info prints them (the check above can fail)
    code = train.main([*args, "--log-every", "1", *FAST, *SMALL_BATCH, "--ckpt-dir", str(tmp_path / "d")])
    out = capsys.readouterr().out
    assert code == 0 and sum(1 for x in out.splitlines() if "trainer.loop: step " in x and "| loss" in x) == 4
