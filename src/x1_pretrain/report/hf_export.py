"""Checkpoint → Hugging Face Llama folder (config, fp32 safetensors, GPT-2 tokenizer files, provenance),
built under a temporary name and renamed into place; ``export_hf.py`` is the command."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from .. import __version__
from ..core import safetensors_io as st
from ..core.errors import X1Error
from ..core.fileio import fsync_tree, replace_dir
from . import model_card
from .ckpt_source import Source, load_model

# transformers 5.x disables itself below torch 2.6 ("PyTorch >= 2.6 is required"); the 4.x line up to 4.57 loads
# the export with torch 2.5 (the NVIDIA 24.10 container). The same pin is the [hf-torch25] extra and
# constraints/torch25.txt, which the Python 3.10 + torch 2.5 CI lane installs with.
TRANSFORMERS_FOR_TORCH25 = "transformers>=4.44,<5"


def transformers_hint(torch_version: str) -> str | None:
    """What to install to load the export, when this torch is older than transformers 5.x accepts."""
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    if m is None or (int(m.group(1)), int(m.group(2))) >= (2, 6):
        return None
    return (
        f"torch {torch_version} is older than 2.6, which transformers 5.x requires: load the export with "
        f"{TRANSFORMERS_FOR_TORCH25!r} (pip install 'x1_pretrain[hf-torch25]', or pip install "
        f"'{TRANSFORMERS_FOR_TORCH25}'); lm-eval-harness 0.4.x runs on it"
    )


def generation_config(eos_id: int) -> dict[str, Any]:
    # GPT-2 has no pad token; padding with EOT is what generate() would pick anyway (minus the warning)
    return {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": False}


def hf_files(src: Source) -> tuple[dict[str, Any], dict[str, Any]]:
    from ..model.transformer import hf_config

    cfg = {**hf_config(src.model), "torch_dtype": "float32", "use_cache": True}
    eot = model_card.tokenizer_info(src).get("eot_id")
    if isinstance(eot, int):  # the data's end of text (GPT-2's is the last id, hf_config's default)
        cfg["bos_token_id"] = cfg["eos_token_id"] = eot
    return cfg, generation_config(cfg["eos_token_id"])


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise X1Error(f"--output {output}: exists and is not a directory; choose a new folder name")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise X1Error(
            f"--output {output}: already exists and is not empty; pass --overwrite to replace it, "
            "or choose a new folder"
        )


def export(
    src: Source,
    output: Path,
    tokenizer_file: str | None = None,
    with_tokenizer: bool = True,
    overwrite: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    """Write the folder; returns the provenance record written as ``x1_export.json``."""
    from ..model.transformer import state_dict_for_saving

    _check_output(output, overwrite)
    model = load_model(src)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        config, gen = hf_files(src)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", gen)
        tensors = state_dict_for_saving(model)
        digest = st.save(tensors, tmp / "model.safetensors", {"format": "pt"})
        tokenizer_note = _tokenizer(tmp, src, tokenizer_file, with_tokenizer, log)
        record = {
            "x1_pretrain": __version__,
            "source_weights": str(src.weights.resolve()),
            "config_from": src.config_from,
            "step": src.step,
            "tokens_seen": None if src.state is None else src.state.get("tokens_seen"),
            "config_sha256": None if src.state is None else src.state.get("config_sha256"),
            "model_safetensors_sha256": digest,
            "parameters": sum(int(t.numel()) for t in tensors.values()),
            "tokenizer": tokenizer_note,
        }
        _write_json(tmp / "x1_export.json", record)
        resolved = model_card.config_yaml(src)
        if resolved is not None:
            (tmp / "x1_config.yaml").write_text(resolved)
        card = model_card.card(src, record, tokenizer_note, model_card.task_scores(src))
        (tmp / "README.md").write_text(card, encoding="utf-8")
        fsync_tree(tmp)
        replace_dir(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _tokenizer(tmp: Path, src: Source, tokenizer_file: str | None, wanted: bool, log: Any) -> str:
    if not wanted:
        return "not written (--no-tokenizer)"
    if model_card.uses_own_tokenizer(src):
        return _own_tokenizer(tmp, src, log)
    from ..data.gpt2_files import write_tokenizer_files
    from ..data.tokenizer import GPT2_VOCAB_SIZE, load_gpt2

    if src.model.vocab_size != GPT2_VOCAB_SIZE:
        note = (
            f"not written: model.vocab_size is {src.model.vocab_size}, not GPT-2's {GPT2_VOCAB_SIZE}, so "
            "GPT-2's tokenizer files would not match the embedding"
        )
        log(f"warning: tokenizer {note}")
        return note
    try:
        tok = load_gpt2(tokenizer_file, allow_download=False)
        names = write_tokenizer_files(tmp, tok, src.model.seq_len)
    except (X1Error, OSError, ValueError) as e:
        for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"):
            (tmp / name).unlink(missing_ok=True)
        first = str(e).splitlines()[0]
        log(
            f"warning: the model was exported WITHOUT tokenizer files ({first}). Run "
            "`python -m x1_pretrain.tokenizer fetch` (or pass --tokenizer-file) and export again, or load "
            "the tokenizer with AutoTokenizer.from_pretrained('openai-community/gpt2'), which is the same BPE"
        )
        return f"not written: {first}"
    return f"GPT-2 BPE from {tok.source}: {', '.join(names)}"


def _own_tokenizer(tmp: Path, src: Source, log: Any) -> str:
    """The data's tokenizer.json (the run's, by its sha256) as a transformers tokenizer folder."""
    path, looked = model_card.find_tokenizer(src)
    if path is None:
        where = "; ".join(looked) or "no place to look"
        log(
            f"warning: the model was exported WITHOUT its tokenizer: no tokenizer.json with the run's sha256 "
            f"({where}); copy the data dir's tokenizer.json beside the checkpoint and export again"
        )
        return f"not written: the run's tokenizer.json was not found ({where})"
    info = model_card.tokenizer_info(src)
    files = model_card.tokenizer_folder(path.read_text(encoding="utf-8"), str(info.get("eot_token")), src.model.seq_len)
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    return f"the data's own tokenizer from {path}: {', '.join(sorted(files))}"
