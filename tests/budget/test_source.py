from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from x1_pretrain.budget.source import read_source

from ..servers import DripServer, JsonServer


def test_read_source_variants(tmp_path):
    p = tmp_path / "budget.json"
    assert "does not exist" in read_source(str(p)).problem
    p.write_text("{not json")
    assert "not valid JSON" in read_source(p.as_uri()).problem
    p.write_text(
        json.dumps(
            {
                "spent_usd": 1.0,
                "rate_usd_per_hr": 1.1,
                "hours_elapsed": 1,
                "projected_total_usd": 2,
                "last_update_utc": "2026-05-23T15:42:01Z",
            }
        )
    )
    r = read_source(str(p))
    assert r.problem is None and r.snapshot.rate_usd_per_hr == 1.1
    assert r.snapshot.last_update_utc == datetime(2026, 5, 23, 15, 42, 1, tzinfo=timezone.utc)


def test_an_http_source_has_a_total_deadline_and_its_secrets_stay_hidden():
    drip = DripServer(0.1)
    try:
        t0 = time.monotonic()
        r = read_source(drip.url + "?token=s3cr3t-budget", deadline_s=1.0)
        assert time.monotonic() - t0 < 2.0 and "timeout" in r.problem and "s3cr3t-budget" not in r.problem
    finally:
        drip.close()
    s = JsonServer()
    try:
        s.route(
            "/budget.json",
            {
                "spent_usd": 2.0,
                "rate_usd_per_hr": 1.1,
                "hours_elapsed": 1,
                "projected_total_usd": 3,
                "last_update_utc": "2026-05-23T15:42:01Z",
            },
        )
        assert read_source(s.base + "/budget.json?token=abc").snapshot.spent_usd == 2.0
        s.route("/budget.json", {"no": "way"}, status=401)
        r = read_source(s.base + "/budget.json?token=abcdefsecret")
        assert "HTTP 401" in r.problem and "abcdefsecret" not in r.problem
    finally:
        s.close()
