"""A folder to and from moto's S3 server, whole or not at all: ``python -m x1_pretrain.remote push|pull``."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from x1_pretrain import remote
from x1_pretrain.ckpt.objstore import RemoteURL, Store
from x1_pretrain.ckpt.remote_dir import MANIFEST, PullFailed, listing, pull, push
from x1_pretrain.core.errors import X1Error


def _tokens(path):
    """A tokenized folder the way tokenize_data writes one: uint16 shards, meta.json, a hidden temporary."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("train_000.bin", "train_001.bin", "val_000.bin"):
        rng.integers(0, 50257, 300_000, dtype=np.uint16).tofile(path / name)
    (path / "meta.json").write_text(json.dumps({"vocab_size": 50257}))
    (path / ".train_002.bin.tmp").write_bytes(b"half")  # an x1 file still being written: never pushed
    return path


def test_push_then_pull_gives_the_same_folder_and_a_second_push_sends_nothing(s3env, tmp_path):
    src = _tokens(tmp_path / "tokenized")
    store = Store(RemoteURL.parse(s3env + "/data/tokenized"))
    assert push(store, src, print) == (4, sum(p.stat().st_size for p in src.iterdir() if p.name[0] != "."))
    assert ".train_002.bin.tmp" not in store.list_objects()
    assert push(store, src, print) == (0, 0)  # already there, hashes equal
    dest = tmp_path / "new-machine" / "tokenized"
    assert pull(store, dest, print) == "pulled"
    assert listing(dest) == listing(src)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["tokenized"]  # no pull folder left behind
    assert pull(store, dest, print) == "present"


def test_a_push_cut_short_is_never_pulled_and_a_wrong_file_is_refused_whole(s3env, tmp_path):
    src = _tokens(tmp_path / "tokenized")
    store = Store(RemoteURL.parse(s3env + "/tok"))
    push(store, src, print)
    store.delete([MANIFEST])  # as a push cut short leaves it: files, no manifest
    assert pull(store, tmp_path / "a", print) == "absent" and not (tmp_path / "a").exists()
    push(store, src, print)
    size = (src / "train_001.bin").stat().st_size
    store.put_bytes(b"x" * size, "train_001.bin")  # changed behind the manifest's back, the same size
    with pytest.raises(PullFailed, match=r"train_001\.bin does not match"):
        pull(store, tmp_path / "b", print)
    assert not (tmp_path / "b").exists() and [p.name for p in tmp_path.iterdir()] == ["tokenized"]
    assert push(store, src, print) == (1, size)  # the object's own sha256 tells the push what to send again
    assert pull(store, tmp_path / "b", print) == "pulled" and listing(tmp_path / "b") == listing(src)


def test_a_repush_deletes_only_what_its_last_manifest_listed(s3env, tmp_path):
    src = _tokens(tmp_path / "tokenized")
    store = Store(RemoteURL.parse(s3env + "/tok"))
    store.put_bytes(b"someone else's", "notes.txt")
    push(store, src, print)
    (src / "val_000.bin").unlink()
    (src / "val_001.bin").write_bytes(b"\x01\x00" * 1000)
    push(store, src, print)
    keys = set(store.list_objects())
    assert "val_000.bin" not in keys and {"val_001.bin", "notes.txt", MANIFEST} <= keys


def test_refusals_name_the_fix(s3env, tmp_path, capsys):
    src = _tokens(tmp_path / "tokenized")
    ckpt_root = Store(RemoteURL.parse(s3env))
    ckpt_root.put_bytes(b"step_0000004\n", "latest")
    with pytest.raises(X1Error, match=r"holds a checkpoint mirror .*push under a prefix of its own"):
        push(ckpt_root, src, print)
    store = Store(RemoteURL.parse(s3env + "/data/tokenized"))
    push(store, src, print)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "other.bin").write_bytes(b"x")
    with pytest.raises(X1Error, match="not an empty folder, and it differs"):
        pull(store, busy, print)
    assert remote.main(["pull", s3env + "/nothing", str(tmp_path / "n")]) == 2
    assert "no complete copy" in capsys.readouterr().err
    assert remote.main(["pull", s3env + "/nothing", str(tmp_path / "n"), "--if-present"]) == 0
    assert remote.main(["push", str(tmp_path / "missing"), s3env + "/x"]) == 2
    assert remote.main(["pull", "gs://bucket/x", str(tmp_path / "n")]) == 2
    assert "expected s3://BUCKET/PREFIX" in capsys.readouterr().err


def test_the_command_exit_codes_for_the_store(s3env, tmp_path, monkeypatch, capsys):
    src = _tokens(tmp_path / "tokenized")
    assert remote.main(["push", str(src), s3env + "/t"]) == 0
    assert remote.main(["pull", s3env + "/t", str(tmp_path / "copy")]) == 0
    assert listing(tmp_path / "copy") == listing(src)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-4321")
    assert remote.main(["pull", s3env + "/t", str(tmp_path / "copy2")]) == 2
    err = capsys.readouterr().err
    assert "refused the credentials" in err and "AWS_ACCESS_KEY_ID" in err
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: unreachable, worth a retry
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert remote.main(["pull", s3env + "/t", str(tmp_path / "copy3")]) == 1
    assert "try again" in capsys.readouterr().err and not (tmp_path / "copy3").exists()


def test_a_log_that_grows_while_it_is_pushed_comes_back_as_pushed(s3env, tmp_path):
    """The manifest's hash is the hash of the bytes that went up (a snapshot), not of the file a moment before."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "train.log"
    log.write_text("step 0\n" * 20_000)
    pushed = threading.Event()

    def write() -> None:
        n = 0
        while not pushed.is_set():
            with open(log, "a") as f:
                f.write(f"step {n}\n")
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    store = Store(RemoteURL.parse(s3env + "/logs"))
    try:
        push(store, logs, print)
    finally:
        pushed.set()
        writer.join()
    assert pull(store, tmp_path / "back", print) == "pulled"
    assert log.read_text().startswith((tmp_path / "back" / "train.log").read_text())


def test_pull_never_deletes_what_it_did_not_write_and_refuses_paths_outside_its_folder(s3env, tmp_path):
    src = _tokens(tmp_path / "tokenized")
    store = Store(RemoteURL.parse(s3env + "/tok"))
    assert push(store, src, print, if_absent=True)[0] == 4
    (src / "meta.json").write_text("{}")
    assert push(store, src, print, if_absent=True) == (0, 0)  # the tokens a run trained on are left alone
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    with pytest.raises(X1Error, match="not an empty folder"):
        pull(store, repo, print)
    assert (repo / ".git").is_dir()
    old = tmp_path / f".fresh.pull-{2**22 + 12345}"  # a pull killed long ago (no such process)
    old.mkdir()
    assert pull(store, tmp_path / "fresh", print) == "pulled" and not old.exists()
    manifest = json.loads(store.get_bytes(MANIFEST))
    manifest["files"]["../../escaped"] = manifest["files"].pop("meta.json")
    store.put_bytes(json.dumps(manifest).encode(), MANIFEST)
    with pytest.raises(X1Error, match="outside its folder"):
        pull(store, tmp_path / "evil", print)
    assert not (tmp_path.parent / "escaped").exists() and not (tmp_path / "evil").exists()


def test_a_symlink_in_the_folder_is_never_followed_when_pushing(s3env, tmp_path):
    """A link in ``logs/`` to a file outside it (or to a folder) is not uploaded: the outside bytes stay home."""
    secret = tmp_path / "outside" / "credentials"
    secret.parent.mkdir()
    secret.write_text("aws_secret_access_key = SECRET-4242\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_text("step 1\n")
    os.symlink(secret, logs / "train-2.log")
    os.symlink(secret.parent, logs / "more")
    store = Store(RemoteURL.parse(s3env + "/logs"))
    lines: list[str] = []
    push(store, logs, lines.append)
    assert sorted(store.list_objects()) == ["train.log", MANIFEST]
    assert any("2 symlink(s) not pushed" in x and "train-2.log" in x for x in lines)
    assert b"SECRET" not in b"".join(store.get_bytes(k) or b"" for k in store.list_objects())


@pytest.mark.parametrize("key", ["/etc/x1-escaped", "a//b", "a\\..\\..\\b", "sub/../../escaped", "."])
def test_a_manifest_path_that_leaves_the_folder_is_refused_before_anything_is_written(s3env, tmp_path, key):
    src = _tokens(tmp_path / "tokenized")
    store = Store(RemoteURL.parse(s3env + "/tok"))
    push(store, src, print)
    manifest = json.loads(store.get_bytes(MANIFEST))
    manifest["files"][key] = manifest["files"]["meta.json"]
    store.put_bytes(json.dumps(manifest).encode(), MANIFEST)
    with pytest.raises(X1Error, match=r"outside its folder") as e:
        pull(store, tmp_path / "evil", print)
    assert repr(key)[1:-1] in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenized"]  # not even the pull folder


def test_a_symlinked_parent_cannot_take_a_pulled_file_outside(tmp_path):
    from x1_pretrain.core.fileio import OutsideFolder, inside

    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path, root / "up")
    assert inside(root, "a/b.txt") == root.resolve() / "a" / "b.txt"
    with pytest.raises(OutsideFolder, match=r"'up/x' would be written outside its folder .*through the symlink"):
        inside(root, "up/x", "the key")
    for bad in ("", "a\x00b", "../x"):
        with pytest.raises(OutsideFolder, match="outside its folder"):
            inside(root, bad)


def test_verify_reads_the_copy_back_and_names_every_object_that_differs(s3, s3env, tmp_path, capsys):
    """What the end of the bill relies on before it terminates: the manifest and a head of every object."""
    from x1_pretrain.ckpt.remote_dir import verify

    src = _tokens(tmp_path / "bundle")
    url = s3env + "/bundle"
    assert remote.main(["push", "--verify", str(src), url]) == 0
    assert "every file of" in capsys.readouterr().out
    store = Store(RemoteURL.parse(url))
    assert verify(store, src) == []
    key = RemoteURL.parse(url).key("train_001.bin")
    s3.client().put_object(Bucket=RemoteURL.parse(url).bucket, Key=key, Body=b"not the shard")  # replaced behind
    s3.client().delete_object(Bucket=RemoteURL.parse(url).bucket, Key=RemoteURL.parse(url).key("meta.json"))
    (src / "val_000.bin").write_bytes(b"changed here after the push")
    got = verify(store, src)
    assert len(got) == 3 and any("train_001.bin: differs" in g for g in got)
    assert any("meta.json: absent" in g for g in got) and any(
        "val_000.bin: not in the remote manifest" in g for g in got
    )
    store.delete([MANIFEST])
    assert verify(store, src) == [f"{url}/{MANIFEST}: absent (the push did not complete)"]
