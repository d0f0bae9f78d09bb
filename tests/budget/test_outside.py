from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from x1_pretrain.budget.guard import Action, Memory, parse
from x1_pretrain.budget.ledger import Ledger
from x1_pretrain.budget.outside import check_from_outside

NOW = datetime(2026, 5, 23, 12, 0, tzinfo=timezone.utc)


def test_the_watchdog_reads_the_ledger_so_a_dead_sidecar_cannot_hide_the_spend(tmp_path):
    budget = tmp_path / "budget.json"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    snap = parse(
        {
            "spent_usd": 34.0,
            "rate_usd_per_hr": 1.2,
            "hours_elapsed": 10,
            "projected_total_usd": 34.0,
            "last_update_utc": NOW.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ).snapshot
    Ledger(ckpt, 35.0).save(NOW, Memory(last_good=snap, spent_usd=34.0, spent_at=NOW, rate_usd_per_hr=1.2))
    # the sidecar is gone (no budget.json): the ledger's spend ages at $1.20/h
    assert check_from_outside(str(budget), 35.0, ckpt, NOW + timedelta(minutes=30)).action != Action.EXIT_NOW
    late = check_from_outside(str(budget), 35.0, ckpt, NOW + timedelta(minutes=55))
    assert late.action == Action.EXIT_NOW and late.spent_usd > 35.0
    # a fresh reading far below the ledger is not believed either
    budget.write_text(
        json.dumps(
            {
                "spent_usd": 1.0,
                "rate_usd_per_hr": 1.2,
                "hours_elapsed": 1,
                "projected_total_usd": 1.0,
                "last_update_utc": (NOW + timedelta(minutes=55)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    )
    assert check_from_outside(str(budget), 35.0, ckpt, NOW + timedelta(minutes=55)).action == Action.EXIT_NOW
