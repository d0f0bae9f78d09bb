from __future__ import annotations

import time

import pytest

from x1_pretrain.core.http import HttpError, request

from ..servers import DripServer, JsonServer


def test_a_request_gets_the_body_and_non_2xx_is_an_error():
    s = JsonServer()
    try:
        s.route("/ok", {"a": 1})
        s.route("/bad", {"error": "no"}, status=503)
        assert request(s.base + "/ok", 5).body == b'{"a": 1}'
        with pytest.raises(HttpError) as e:
            request(s.base + "/bad", 5)
        assert e.value.kind == "HTTP 503" and e.value.status == 503 and "no" in e.value.detail
    finally:
        s.close()


def test_a_dripping_answer_is_cut_off_at_the_total_deadline():
    # one byte every 0.1 s never trips a per-read timeout; the total deadline ends it
    drip = DripServer(0.1)
    try:
        t0 = time.monotonic()
        with pytest.raises(HttpError) as e:
            request(drip.url, 1.0)
        assert e.value.kind == "timeout" and time.monotonic() - t0 < 2.0
    finally:
        drip.close()


def test_nothing_listening_and_a_bad_url_are_errors():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HttpError) as e:
        request(f"http://127.0.0.1:{port}/x", 2)
    assert e.value.kind == "network error"
    with pytest.raises(HttpError, match="bad url"):
        request("ftp://host/x", 2)
