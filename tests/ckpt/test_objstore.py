"""The object store against a real S3 server (moto's, with IAM authentication) on 127.0.0.1."""

from __future__ import annotations

import pytest

from x1_pretrain.ckpt.objstore import RemoteURL, Store, StoreError, launch_check, scrub
from x1_pretrain.core.errors import X1Error

from ..s3server import free_port


def test_urls_parse_and_bad_ones_name_the_form():
    u = RemoteURL.parse("s3://my-bucket/runs/lab-1/")
    assert (u.bucket, u.prefix, u.key("latest"), str(u)) == (
        "my-bucket",
        "runs/lab-1",
        "runs/lab-1/latest",
        "s3://my-bucket/runs/lab-1",
    )
    assert RemoteURL.parse("s3://my-bucket").key("latest") == "latest"
    for bad in ("gs://b/p", "/local/dir", "s3://", "s3://UPPER/p"):
        with pytest.raises(X1Error, match=r"s3://BUCKET/PREFIX|bucket name"):
            RemoteURL.parse(bad)


def test_put_get_list_delete_round_trip(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    f = tmp_path / "blob"
    f.write_bytes(bytes(range(256)) * 4000)
    store.put_file(f, "step_0000001/model.safetensors")
    store.put_bytes(b"step_0000001\n", "latest")
    assert store.list_objects() == {"step_0000001/model.safetensors": 1_024_000, "latest": 13}
    assert store.get_bytes("latest") == b"step_0000001\n" and store.get_bytes("nope") is None
    store.get_file("step_0000001/model.safetensors", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == f.read_bytes()
    store.delete(["latest", "step_0000001/model.safetensors"])
    assert store.list_objects() == {}


def test_launch_check_refuses_wrong_credentials_and_a_missing_bucket_with_the_fix(s3env, monkeypatch):
    store = Store(RemoteURL.parse(s3env))
    assert launch_check(store, print) is True
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0000")
    with pytest.raises(X1Error) as e:
        launch_check(Store(RemoteURL.parse(s3env)), print)
    assert "refused the credentials" in str(e.value) and "AWS_SECRET_ACCESS_KEY" in str(e.value)
    assert "wrong-secret-0000" not in str(e.value)
    monkeypatch.undo()


def test_missing_bucket_is_a_usage_error(s3env):
    with pytest.raises(X1Error, match="create the bucket"):
        launch_check(Store(RemoteURL.parse("s3://no-such-bucket-x1/p")), print)


def test_an_unreachable_store_is_a_warning_at_launch_not_an_error(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAX1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x1-secret-xyz")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    lines: list[str] = []
    store = Store(RemoteURL.parse("s3://bucket-x1/p"), connect_timeout_s=1, attempts=1)
    assert launch_check(store, lines.append) is False
    assert len(lines) == 1 and "cannot be reached" in lines[0] and "x1-secret-xyz" not in lines[0]
    with pytest.raises(StoreError) as e:
        store.put_bytes(b"x", "k")
    assert e.value.kind == "unreachable"


def test_scrub_removes_keys_and_signatures(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "abcd-secret-1234")
    text = scrub("boom abcd-secret-1234 https://h/b/k?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA%2F1 x")
    assert "abcd-secret-1234" not in text and "deadbeef" not in text and "AKIA%2F1" not in text


def test_conditional_writes_lose_cleanly_to_a_writer_that_came_first(s3env):
    """If-None-Match: * refuses a key that exists; If-Match refuses an ETag that is no longer current. Both are
    StoreError ``conflict`` and leave the object as the winner wrote it."""
    store = Store(RemoteURL.parse(s3env))
    store.put_bytes(b"first\n", "latest", if_none_match=True)
    with pytest.raises(StoreError) as e:
        store.put_bytes(b"second\n", "latest", if_none_match=True)
    assert e.value.kind == "conflict"
    data, etag = store.get_tagged("latest")
    assert data == b"first\n"
    store.put_bytes(b"third\n", "latest", if_match=etag)
    with pytest.raises(StoreError) as e:
        store.put_bytes(b"fourth\n", "latest", if_match=etag)  # read before the third write: stale
    assert e.value.kind == "conflict"
    assert store.get_tagged("latest")[0] == b"third\n" and store.get_tagged("nope") is None


def test_the_installed_botocore_has_putobjects_conditional_writes_and_the_floor_says_so():
    """Every conditional write (the mirror's latest and ledger, the prefix's owner) needs IfMatch and IfNoneMatch on
    PutObject; botocore 1.35.69 is the first whose S3 model has both, so pyproject's boto3 floor is 1.35.69."""
    import re

    import botocore.session
    from packaging.requirements import Requirement

    from x1_pretrain.ckpt.objstore import CONDITIONAL_PARAMS

    from ..conftest import REPO

    members = botocore.session.get_session().get_service_model("s3").operation_model("PutObject").input_shape.members
    assert set(CONDITIONAL_PARAMS) <= set(members), sorted(members)
    (spec,) = re.findall(r'^\s*"(boto3[^"]*)"', (REPO / "pyproject.toml").read_text(), re.M)
    floor = Requirement(spec).specifier
    assert floor.contains("1.35.69") and not floor.contains("1.35.68"), spec


def test_a_botocore_without_conditional_writes_is_a_clear_refusal_not_a_retried_other(s3env, tmp_path, monkeypatch):
    """A botocore whose S3 model lacks IfMatch/IfNoneMatch (an older one, made here from the installed model less
    those two members, through AWS_DATA_PATH): the write is ``unsupported`` naming the boto3 to install, and the
    launch check refuses it (exit 2) rather than a mirror that retries an ``other`` failure for ever."""
    import gzip
    import json
    from pathlib import Path

    import botocore

    from x1_pretrain.ckpt.objstore import CONDITIONAL_PARAMS

    (shipped,) = sorted((Path(botocore.__file__).parent / "data" / "s3" / "2006-03-01").glob("service-2.json*"))
    raw = shipped.read_bytes()
    model = json.loads(gzip.decompress(raw) if shipped.suffix == ".gz" else raw)
    put = model["shapes"][model["operations"]["PutObject"]["input"]["shape"]]["members"]
    for name in CONDITIONAL_PARAMS:
        del put[name]
    older = tmp_path / "models" / "s3" / "2006-03-01"
    older.mkdir(parents=True)
    (older / "service-2.json").write_text(json.dumps(model))
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path / "models"))
    store = Store(RemoteURL.parse(s3env))
    store.put_bytes(b"plain writes still work\n", "plain")
    for kwargs in ({"if_none_match": True}, {"if_match": '"etag"'}):
        with pytest.raises(StoreError) as e:
            store.put_bytes(b"x", "latest", **kwargs)
        assert e.value.kind == "unsupported" and "boto3>=1.35.69" in e.value.detail, e.value.detail
    with pytest.raises(X1Error, match=r"IfNoneMatch.*boto3>=1\.35\.69"):
        launch_check(store, print)
    assert store.get_bytes("latest") is None
