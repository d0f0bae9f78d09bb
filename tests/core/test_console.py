"""A closed terminal: writes that fail are diverted to the log file (or /dev/null), never raised."""

from __future__ import annotations

import io
import os
import sys

from x1_pretrain.core import console


def _broken_stream() -> io.TextIOWrapper:
    """A text stream on a pipe whose reader is gone: every write fails (EPIPE), like a hung-up terminal (EIO)."""
    r, w = os.pipe()
    os.close(r)
    return io.TextIOWrapper(os.fdopen(w, "wb", buffering=0), line_buffering=True)


def test_a_write_that_fails_goes_to_the_log_file_from_then_on(tmp_path):
    raw = _broken_stream()
    try:
        raw.write("x\n")
        raise AssertionError("the pipe should refuse writes")
    except BrokenPipeError:
        pass
    log = tmp_path / "run.log"
    stream = console._Resilient(_broken_stream(), log)
    stream.write("first line after the hang-up\n")
    stream.flush()
    print("a later print", file=stream, flush=True)  # type: ignore[arg-type]
    assert stream.diverted == str(log)
    assert log.read_text() == "first line after the hang-up\na later print\n"
    os.write(stream.fileno(), b"a raw write on the descriptor\n")   # child processes and C code write there too
    assert log.read_text().endswith("a raw write on the descriptor\n")


def test_without_a_log_file_output_is_dropped(monkeypatch):
    monkeypatch.delenv(console.LOG_FILE_ENV, raising=False)
    stream = console._Resilient(_broken_stream(), None)
    assert stream.write("lost\n") == 5
    stream.flush()
    assert stream.diverted == os.devnull


def test_guarded_console_wraps_and_restores_the_standard_streams(tmp_path, monkeypatch):
    monkeypatch.setenv(console.LOG_FILE_ENV, str(tmp_path / "x.log"))
    before = sys.stdout, sys.stderr
    with console.guarded_console():
        assert isinstance(sys.stdout, console._Resilient) and sys.stdout._divert_to == tmp_path / "x.log"
        with console.guarded_console():   # nested: no second wrapper
            assert not isinstance(sys.stdout._stream, console._Resilient)
    assert (sys.stdout, sys.stderr) == before
