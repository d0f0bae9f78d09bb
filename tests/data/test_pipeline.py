from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from x1_pretrain import tokenize_data as TD_cli
from x1_pretrain.data import pipeline as TD
from x1_pretrain.data.sources import discover

from ..conftest import REPO, shared_path
from ..corpus_utils import read_docs, write_jsonl, write_parquet

SPECIAL = ["naïve café 🚀 — “quotes”", "a literal <|endoftext|> inside", "  leading space\nand lines\n", "x"]


def run_cli(*args: str) -> int:
    return TD_cli.main(list(args))


def make_corpus(root: Path, prose: list[str]) -> dict[str, list[str]]:
    """Five shard kinds with known documents (prose + awkward strings + empty docs)."""
    docs = prose[:60] + SPECIAL
    parts = {
        "a/fineweb.parquet": [*docs[0:20], "", None],
        "a/b/pile.jsonl.zst": docs[20:35],
        "dolma.jsonl.gz": docs[35:45],
        "plain.jsonl": [*docs[45:64], "   "],
        "z_notes.txt": ["A single text file is one document.\nWith two lines."],
    }
    for rel, texts in parts.items():
        p = root / rel
        if rel.endswith(".parquet"):
            write_parquet(p, texts)
        elif rel.endswith(".txt"):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(texts[0])
        else:
            write_jsonl(p, texts)
    (root / "README.md").write_text("not a shard")
    return parts


def expected_split(parts: dict[str, list], frac: float) -> tuple[list[str], list[str]]:
    train, val = [], []
    for rel in sorted(parts):
        for i, t in enumerate(parts[rel]):
            if t is None or not t.strip():
                continue
            (val if TD.is_val(rel, i, frac) else train).append(t)
    return train, val


def test_round_trip_every_format_document_by_document(tmp_path, tok, prose):
    parts = make_corpus(tmp_path / "in", prose)
    out = tmp_path / "out"
    assert (
        run_cli(
            "--input-dir",
            str(tmp_path / "in"),
            "--output-dir",
            str(out),
            "--tokenizer",
            "gpt2",
            "--val-fraction",
            "0.2",
            "--workers",
            "1",
        )
        == 0
    )
    train, val = expected_split(parts, 0.2)
    assert len(val) > 3 and len(train) > 40
    assert read_docs(out, "train", tok) == train
    assert read_docs(out, "val", tok) == val
    meta = json.loads((out / "meta.json").read_text())
    assert meta["vocab_size"] == 50257 and meta["eot_id"] == 50256 and meta["dtype"] == "uint16"
    assert meta["splits"]["train"]["documents"] == len(train)
    assert meta["splits"]["val"]["documents"] == len(val)
    assert meta["empty_documents_skipped"] == 3
    assert meta["splits"]["train"]["tokens"] * 2 == (out / "train.bin").stat().st_size
    assert meta["tokenizer_sha256"] == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
    assert [s["path"] for s in meta["sources"]] == sorted(parts)
    sizes = {s["path"]: s["bytes"] for s in meta["sources"]}
    assert sizes["plain.jsonl"] == (tmp_path / "in/plain.jsonl").stat().st_size
    counts = np.load(out / "unigram_counts.npy")
    ids = np.fromfile(out / "train.bin", dtype="<u2")
    assert counts.sum() == ids.size and counts[50256] == len(train)
    assert np.array_equal(counts, np.bincount(ids, minlength=50257))
    assert not list(out.glob(".*partial*"))


def test_output_is_byte_identical_for_any_worker_count(tmp_path, prose, monkeypatch):
    monkeypatch.setattr(TD, "CHUNK_CHARS", 3000)  # many chunks, so ordering across workers matters
    make_corpus(tmp_path / "in", prose)
    outs = []
    for w in (1, 2, 3):
        out = tmp_path / f"out{w}"
        assert (
            run_cli(
                "--input-dir",
                str(tmp_path / "in"),
                "--output-dir",
                str(out),
                "--workers",
                str(w),
                "--val-fraction",
                "0.1",
            )
            == 0
        )
        outs.append(out)
    for name in ("train.bin", "val.bin", "unigram_counts.npy"):
        blobs = {(o / name).read_bytes() for o in outs}
        assert len(blobs) == 1, name


def test_val_documents_come_from_the_whole_corpus(tmp_path, prose):
    for k in range(6):
        write_jsonl(tmp_path / "in" / f"shard{k}.jsonl", prose[k * 12 : (k + 1) * 12])
    meta = TD.run(TD.TokenizeJob(tmp_path / "in", tmp_path / "out", val_fraction=0.25, workers=1), print)
    with_val = [s["path"] for s in meta["sources"] if s["val_docs"] > 0]
    assert len(with_val) >= 4, with_val


def test_rerun_same_inputs_is_a_no_op_and_other_inputs_need_overwrite(tmp_path, prose, capsys):
    write_parquet(tmp_path / "in" / "x.parquet", prose[:10])
    args = ["--input-dir", str(tmp_path / "in"), "--output-dir", str(tmp_path / "out"), "--workers", "1"]
    assert run_cli(*args) == 0
    stamp = (tmp_path / "out" / "train.bin").stat().st_mtime_ns
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert (tmp_path / "out" / "train.bin").stat().st_mtime_ns == stamp
    write_parquet(tmp_path / "in" / "y.parquet", prose[10:20])
    assert run_cli(*args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert run_cli(*args, "--overwrite") == 0
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["splits"]["train"]["documents"] == 20


def _bad_inputs(root: Path, prose: list[str]) -> dict[str, tuple[Path, str]]:
    import zstandard

    cases: dict[str, tuple[Path, str]] = {}
    p = root / "corrupt" / "broken.parquet"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"PAR1" + os.urandom(300) + b"PAR1")
    cases["corrupt"] = (p, "parquet")
    p = write_parquet(root / "nocol" / "x.parquet", prose[:3], column="content")
    cases["nocol"] = (p, "no column 'text'")
    p = root / "utf8" / "x.jsonl"
    p.parent.mkdir(parents=True)
    p.write_bytes(b'{"text": "fine"}\n{"text": "bad \xff\xfe byte"}\n')
    cases["utf8"] = (p, "x.jsonl:2: invalid UTF-8")
    p = root / "trunc" / "x.jsonl.zst"
    p.parent.mkdir(parents=True)
    blob = zstandard.ZstdCompressor().compress(b"".join(b'{"text": "%d"}\n' % i for i in range(5000)))
    p.write_bytes(blob[: len(blob) * 2 // 3])
    cases["trunc"] = (p, "truncated zstd")
    p = root / "nokey" / "x.jsonl"
    p.parent.mkdir(parents=True)
    p.write_text('{"text": "ok"}\n{"body": "no text here"}\n')
    cases["nokey"] = (p, "x.jsonl:2: JSON line has no 'text' key")
    p = root / "badjson" / "x.jsonl.gz"
    write_jsonl(p, ["a"])
    import gzip

    p.write_bytes(gzip.compress(b'{"text": "a"}\n{"text": \n'))
    cases["badjson"] = (p, "x.jsonl.gz:2: not valid JSON")
    p = root / "utf8pq" / "x.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    p.parent.mkdir(parents=True)
    pq.write_table(pa.table({"text": pa.array([b"ok", b"ok", b"\xc3\x28bad"], type=pa.binary())}), p)
    cases["utf8pq"] = (p, "row 2: invalid UTF-8")
    return cases


def test_bad_input_names_file_and_line_and_leaves_nothing(tmp_path, prose, capsys):
    for name, (path, needle) in _bad_inputs(tmp_path / "in", prose).items():
        out = tmp_path / f"out-{name}"
        code = run_cli("--input-dir", str(path.parent), "--output-dir", str(out), "--workers", "1")
        err = capsys.readouterr().err
        assert code == 2, name
        assert needle in err and str(path.name) in err, (name, err)
        assert "Traceback" not in err
        assert not (out / "train.bin").exists() and not (out / "meta.json").exists(), name
        assert not list(out.glob(".*partial*")), name


def test_empty_or_missing_input_dir(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert run_cli("--input-dir", str(tmp_path / "empty"), "--output-dir", str(tmp_path / "o")) == 2
    assert "holds no input shards" in capsys.readouterr().err
    assert run_cli("--input-dir", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "o")) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_skip_bad_files_rolls_back_the_bad_file_and_reports_it(tmp_path, prose, tok, monkeypatch):
    monkeypatch.setattr(TD, "CHUNK_CHARS", 2000)  # the bad file's first chunks are written before it fails
    good1 = prose[:8]
    good2 = prose[8:16]
    write_jsonl(tmp_path / "in" / "a.jsonl", good1)
    bad = tmp_path / "in" / "b.jsonl"
    bad.write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in prose[20:30]) + b"{oops\n")
    write_jsonl(tmp_path / "in" / "c.jsonl", good2)
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        assert (
            run_cli(
                "--input-dir",
                str(tmp_path / "in"),
                "--output-dir",
                str(out),
                "--workers",
                workers,
                "--val-fraction",
                "0",
                "--skip-bad-files",
            )
            == 0
        )
        assert read_docs(out, "train", tok) == good1 + good2
        meta = json.loads((out / "meta.json").read_text())
        assert meta["skipped_files"] == [
            {
                "path": "b.jsonl",
                "error": ":11: not valid JSON (Expecting property name enclosed in double quotes at column 2)",
            }
        ]
        counts = np.load(out / "unigram_counts.npy")
        assert counts.sum() == meta["splits"]["train"]["tokens"]


def test_crash_mid_run_leaves_no_finished_looking_output(tmp_path, prose, monkeypatch):
    write_jsonl(tmp_path / "in" / "a.jsonl", prose[:10])
    write_jsonl(tmp_path / "in" / "b.jsonl", prose[10:20])
    real = TD.iter_documents

    def exploding(path, *a, **k):
        if path.name == "b.jsonl":
            raise MemoryError("simulated crash")
        yield from real(path, *a, **k)

    monkeypatch.setattr(TD, "iter_documents", exploding)
    out = tmp_path / "out"
    with pytest.raises(MemoryError):
        TD.run(TD.TokenizeJob(tmp_path / "in", out, workers=1), print)
    assert sorted(p.name for p in out.iterdir()) == []


def test_sigkill_mid_run_leaves_no_train_bin(tmp_path, prose):
    # A real process killed with SIGKILL while writing: only hidden partial files may remain,
    # and the next run cleans them up and finishes.
    big = prose * 10  # 4 x 4.6 MB: seconds of work, long enough that the kill lands mid-write
    for k in range(4):
        write_jsonl(tmp_path / "in" / f"s{k}.jsonl", big)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.tokenize_data",
        "--input-dir",
        str(tmp_path / "in"),
        "--output-dir",
        str(out),
        "--workers",
        "1",
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(out.glob(".train.bin.partial-*")):
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()
    assert run_cli(*cmd[3:]) == 0  # the same command again, in this process
    assert (out / "meta.json").exists() and not list(out.glob(".*partial*"))


def test_discover_is_recursive_sorted_and_ignores_hidden(tmp_path):
    for rel in ["b/2.txt", "a.parquet", "b/1.jsonl.zst", ".hidden/x.txt", "c/.x.jsonl", "d/notes.md"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    assert [p.relative_to(tmp_path).as_posix() for p in discover(tmp_path)] == ["a.parquet", "b/1.jsonl.zst", "b/2.txt"]


def test_lab_command_on_real_fineweb_parquet(tmp_path, tok):
    corpus = shared_path("corpus")
    out = tmp_path / "tokenized"
    assert (
        run_cli(
            "--input-dir",
            str(corpus),
            "--output-dir",
            str(out),
            "--tokenizer",
            "gpt2",
            "--val-fraction",
            "0.001",
            "--workers",
            "16",
        )
        == 0
    )
    import pyarrow.parquet as pq

    docs = [t for t in pq.read_table(corpus / "fineweb_edu_150docs.parquet").column("text").to_pylist()]
    meta = json.loads((out / "meta.json").read_text())
    fw = next(s for s in meta["sources"] if s["path"] == "fineweb_edu_150docs.parquet")
    assert fw["documents"] == len(docs) == 150
    train = read_docs(out, "train", tok)
    # FineWeb-Edu's first document is "The Independent Jane" and is in the output verbatim.
    assert any(d == docs[0] for d in train) or any(d == docs[0] for d in read_docs(out, "val", tok))


def test_module_runs_as_documented(tmp_path, prose):
    write_parquet(tmp_path / "in" / "x.parquet", prose[:5])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "x1_pretrain.tokenize_data",
            "--input-dir",
            str(tmp_path / "in"),
            "--output-dir",
            str(tmp_path / "out"),
            "--tokenizer",
            "gpt2",
            "--val-fraction",
            "0.001",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert "train.bin" in r.stdout and "tokens" in r.stdout


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_in_a_log():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, log = Tty(), io.StringIO()
    for stream in (tty, log):
        r = TD._Reporter(1000, stream=stream, every_s=0.0)
        r.update(500, 3, 1234)
        r.update(1000, 6, 2468, force=True)
    assert "\r" in tty.getvalue() and "2,468 tokens" in tty.getvalue() and "100%" in tty.getvalue()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2 and lines[-1].startswith("[tokenize] 100.0%")
