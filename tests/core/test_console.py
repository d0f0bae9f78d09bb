"""A closed terminal: writes that fail are diverted to the log file (or /dev/null), never raised."""

from __future__ import annotations

import io
import os
import sys

import pytest

from x1_pretrain.core import console


def _broken_stream(line_buffering: bool = True) -> io.TextIOWrapper:
    """A text stream on a pipe whose reader is gone: every write fails (EPIPE), like a hung-up terminal (EIO).
    Buffered as sys.stdout is (TextIOWrapper over a BufferedWriter)."""
    r, w = os.pipe()
    os.close(r)
    return io.TextIOWrapper(os.fdopen(w, "wb"), line_buffering=line_buffering)


@pytest.mark.parametrize("line_buffering", [True, False])  # a terminal's stdout, and a pipe's
def test_a_write_that_fails_goes_to_the_log_file_from_then_on(tmp_path, line_buffering):
    raw = _broken_stream()
    with pytest.raises(BrokenPipeError):
        raw.write("x\n")
    log = tmp_path / "run.log"
    stream = console._Resilient(_broken_stream(line_buffering), log)
    stream.write("first line after the hang-up\n")
    stream.flush()
    print("a later print", file=stream, flush=True)  # type: ignore[arg-type]
    assert stream.diverted == str(log)
    assert log.read_text() == "first line after the hang-up\na later print\n"  # each line once
    os.write(stream.fileno(), b"a raw write on the descriptor\n")  # child processes and C code write there too
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
        with console.guarded_console():  # nested: no second wrapper
            assert not isinstance(sys.stdout._stream, console._Resilient)
    assert (sys.stdout, sys.stderr) == before
