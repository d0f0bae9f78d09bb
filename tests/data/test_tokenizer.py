from __future__ import annotations

import json
from pathlib import Path

import pytest

from x1_pretrain import tokenizer as T_cli
from x1_pretrain.core.errors import TokenizerNotFound
from x1_pretrain.data import tokenizer as T

from ..conftest import shared_path


def test_known_ids_need_no_reference_file(tok):
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    assert tok.encoding.n_vocab == 50257
    assert tok.eot_id == 50256
    assert tok.encoding.encode("<|endoftext|>", allowed_special="all") == [50256]


def test_special_token_text_in_a_document_is_ordinary_text(tok):
    ids = tok.encode("a<|endoftext|>b")
    assert 50256 not in ids
    assert tok.decode(ids) == "a<|endoftext|>b"


def test_pretokenizer_splits_contractions_and_spaces_like_gpt2(tok):
    # GPT-2 splits "'s" off, keeps leading spaces on words, and leaves trailing whitespace alone.
    words = [tok.decode([i]) for i in tok.encode("It's  a test   ")]
    assert words[:2] == ["It", "'s"]
    assert "".join(words) == "It's  a test   "


def test_golden_ids_from_independent_reference(tok):
    data = json.loads(shared_path("tokenizer", "gpt2_hf_tik_testdata.json").read_text())
    assert len(data["samples"]) >= 10
    for sample in data["samples"]:
        assert tok.encode(sample["text"]) == sample["ids"], sample["name"]


def test_ranks_match_vocab_bpe_and_encoder_json_rebuilt_by_tiktoken(tok, tmp_path):
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    vocab = shared_path("tokenizer", "vocab.bpe")
    encoder = shared_path("tokenizer", "encoder.json")
    ranks = data_gym_to_mergeable_bpe_ranks(str(vocab), str(encoder))
    ours = tok.encoding._mergeable_ranks
    assert len(ranks) == len(ours) == 50256
    assert ranks == ours


def test_explicit_file_beats_env_and_cache(tmp_path, monkeypatch):
    good = T.cached_file()
    copy = tmp_path / "gpt2.tiktoken"
    copy.write_bytes(good.read_bytes())
    monkeypatch.setenv(T.TOKENIZER_ENV, str(tmp_path / "missing.tiktoken"))
    tok = T.load_gpt2(copy, allow_download=False)
    assert tok.source == str(copy)
    assert tok.file_sha256 == T.GPT2_TIKTOKEN_SHA256


def test_wrong_hash_is_rejected_and_named(tmp_path, monkeypatch):
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(b"aGVsbG8= 0\n")
    monkeypatch.setenv(T.CACHE_ENV, str(tmp_path / "empty-cache"))
    with pytest.raises(TokenizerNotFound) as e:
        T.load_gpt2(bad, allow_download=False)
    msg = str(e.value)
    assert str(bad) in msg and "sha256" in msg and "x1_pretrain.tokenizer fetch" in msg


def test_nothing_found_gives_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv(T.CACHE_ENV, str(tmp_path / "empty-cache"))
    monkeypatch.delenv(T.TOKENIZER_ENV, raising=False)
    with pytest.raises(TokenizerNotFound) as e:
        T.load_gpt2(None, allow_download=False)
    assert "--tokenizer-file" in str(e.value) and T.TOKENIZER_ENV in str(e.value)


def test_env_var_is_used(tmp_path, monkeypatch):
    copy = tmp_path / "g.tiktoken"
    copy.write_bytes(T.cached_file().read_bytes())
    monkeypatch.setenv(T.CACHE_ENV, str(tmp_path / "empty-cache"))
    monkeypatch.setenv(T.TOKENIZER_ENV, str(copy))
    assert T.load_gpt2(None, allow_download=False).source == str(copy)


def test_fetch_reports_a_failing_registry_clearly(tmp_path):
    fake_pip = tmp_path / "pip"
    fake_pip.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found' >&2\nexit 1\n")
    fake_pip.chmod(0o755)
    with pytest.raises(TokenizerNotFound) as e:
        T.fetch_into_cache(tmp_path / "out" / "gpt2.tiktoken", pip=[str(fake_pip)])
    assert "No matching distribution" in str(e.value)
    assert not (tmp_path / "out" / "gpt2.tiktoken").exists()


def test_fetch_is_a_no_op_when_cache_is_valid(tmp_path):
    dest = tmp_path / "gpt2.tiktoken"
    dest.write_bytes(T.cached_file().read_bytes())
    assert T.fetch_into_cache(dest, pip=["/nonexistent/pip"]) == dest


def test_cli_show_and_errors(tmp_path, monkeypatch, capsys):
    assert T_cli.main(["show", "Hello world"]) == 0
    assert "[15496, 995]" in capsys.readouterr().out
    monkeypatch.setenv(T.CACHE_ENV, str(tmp_path))
    assert T_cli.main(["show", "--tokenizer-file", str(tmp_path / "nope"), "x"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv(T.CACHE_ENV, str(tmp_path))
    assert T.cached_file() == Path(tmp_path) / "gpt2.tiktoken"


def _sdist_pip(tmp_path: Path, add) -> list[str]:
    """A pip whose ``download`` leaves the sdist ``add(tar)`` built in the folder after ``-d``."""
    import io
    import tarfile

    sdist = tmp_path / "openai-whisper-20250625.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        readme = tarfile.TarInfo("openai-whisper-20250625/README.md")
        readme.size = 3
        tar.addfile(readme, io.BytesIO(b"hi\n"))
        add(tar)
    pip = tmp_path / "pip"
    pip.write_text(f'#!/bin/bash\ncp {sdist} "${{@: -1}}"\n')
    pip.chmod(0o755)
    return [str(pip)]


def test_a_symlink_member_in_the_sdist_is_refused_by_name_not_a_key_error(tmp_path):
    import tarfile

    def link(tar: tarfile.TarFile) -> None:
        member = tarfile.TarInfo(f"openai-whisper-20250625/{T.WHISPER_MEMBER}")
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(member)

    with pytest.raises(TokenizerNotFound, match=r"gpt2\.tiktoken is a symlink, not the file x1 expects"):
        T.fetch_into_cache(tmp_path / "out" / "gpt2.tiktoken", pip=_sdist_pip(tmp_path, link))
    assert not (tmp_path / "out").exists()


def test_a_member_of_another_size_is_refused_before_it_is_read(tmp_path):
    import io
    import tarfile

    def big(tar: tarfile.TarFile) -> None:
        member = tarfile.TarInfo(f"openai-whisper-20250625/{T.WHISPER_MEMBER}")
        member.size = 4 << 20  # zeros compress to a few KB: the archive is small, the member is not
        tar.addfile(member, io.BytesIO(bytes(member.size)))

    with pytest.raises(TokenizerNotFound, match=r"is 4,194,304 bytes, expected 835,554; nothing was read"):
        T.fetch_into_cache(tmp_path / "out" / "gpt2.tiktoken", pip=_sdist_pip(tmp_path, big))
    assert not (tmp_path / "out").exists()
