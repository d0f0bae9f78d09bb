"""What travels with an exported model besides its weights: the data's own tokenizer (any ``tokenizer.json``) as
a transformers tokenizer folder, and the model card (``README.md``): data and shares, tokenizer, tokens, val loss
and bits per byte, task scores, dollars, and the commands that reproduce the run."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from ..core import config as C
from .ckpt_source import Source

TOKENIZER_FILE = "tokenizer.json"


def tokenizer_info(src: Source) -> dict[str, Any]:
    """The tokenizer the checkpoint records ({} for a checkpoint from before x1 recorded it: GPT-2's)."""
    info = (src.state or {}).get("tokenizer")
    return info if isinstance(info, dict) else {}


def uses_own_tokenizer(src: Source) -> bool:
    return tokenizer_info(src).get("tokenizer", "gpt2") != "gpt2"


def find_tokenizer(src: Source) -> tuple[Path | None, list[str]]:
    """The run's tokenizer.json: the checkpoint dir's copy, else the data dir's, whichever has the sha256 the
    checkpoint records. Returns (path or None, where it looked and what it found)."""
    want = (src.state or {}).get("tokenizer_sha256")
    here = src.weights.resolve().parent
    places = [here, here.parent]
    data_dir = (src.state or {}).get("data_dir")
    if data_dir:
        places.append(Path(data_dir))
    looked = []
    for d in places:
        p = d / TOKENIZER_FILE
        if not p.is_file():
            looked.append(f"{p}: absent")
            continue
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        if want is None or digest == want:
            return p, looked
        looked.append(f"{p}: sha256 {digest[:16]}…, not the run's {str(want)[:16]}…")
    return None, looked


def load_tokenizer(src: Source, tokenizer_file: str | None = None) -> Any:
    """The tokenizer the checkpoint's run was trained with (``sample`` and ``evaluate`` use it): the data's own
    tokenizer.json (by its sha256) or GPT-2's BPE (``tokenizer_file``: its ranks file)."""
    from ..core.errors import X1Error
    from ..data import hf_tokenizer
    from ..data.tokenizer import load_gpt2

    if not uses_own_tokenizer(src):
        return load_gpt2(tokenizer_file)
    path, looked = find_tokenizer(src)
    if path is None:
        raise X1Error(
            f"{src.weights}: the run used its own tokenizer (sha256 {(src.state or {}).get('tokenizer_sha256')}), "
            f"and no tokenizer.json with that hash was found ({'; '.join(looked)}); copy the data dir's "
            "tokenizer.json beside the checkpoint"
        )
    return hf_tokenizer.load_tokenizer_json(path, str(tokenizer_info(src).get("eot_token")))


def tokenizer_folder(text: str, eot_token: str, model_max_length: int) -> dict[str, str]:
    """File name -> content of a transformers tokenizer folder around a ``tokenizers`` file: what
    ``AutoTokenizer.from_pretrained`` loads as a PreTrainedTokenizerFast, end of text as bos, eos and pad."""
    special = {"bos_token": eot_token, "eos_token": eot_token, "pad_token": eot_token}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # decode(encode(text)) == text
        # no token_type_ids: transformers 4.x's generate() refuses them for a Llama (generate(**tok(text)))
        "model_input_names": ["input_ids", "attention_mask"],
        **special,
    }
    return {
        TOKENIZER_FILE: text,
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
    }


def _data_meta(src: Source) -> dict[str, Any] | None:
    d = (src.state or {}).get("data_dir")
    try:
        meta = json.loads((Path(d) / "meta.json").read_text()) if d else None
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _number(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "n/a"


def _data_lines(src: Source, meta: dict[str, Any] | None) -> list[str]:
    state = src.state or {}
    if meta is None:
        return [f"- Data: `{state.get('data_dir')}` (its meta.json was not readable at export time)"]
    files = [s for s in meta.get("sources", []) if isinstance(s, dict)]
    total = sum(int(s.get("train_tokens") or 0) for s in files) or 1
    lines = [
        f"- Data: `{state.get('data_dir')}`, tokenized from `{meta.get('input_dir')}`: "
        f"{_number(meta['splits']['train']['tokens'], ',')} train and {_number(meta['splits']['val']['tokens'], ',')} "
        f"val tokens, {len(files)} source files",
        "",
        "| source file | train tokens | share |",
        "|---|---:|---:|",
    ]
    for s in files[:20]:
        n = int(s.get("train_tokens") or 0)
        lines.append(f"| `{s.get('path')}` | {n:,} | {100 * n / total:.1f} % |")
    if len(files) > 20:
        rest = sum(int(s.get("train_tokens") or 0) for s in files[20:])
        lines.append(f"| {len(files) - 20} more files | {rest:,} | {100 * rest / total:.1f} % |")
    return [*lines, ""]


def _tokenize_command(meta: dict[str, Any] | None) -> str:
    if meta is None:
        return "python -m x1_pretrain.tokenize_data --input-dir RAW --output-dir DATA"
    fp = meta.get("fingerprint") or {}
    parts = ["python -m x1_pretrain.tokenize_data", f"--input-dir {meta.get('input_dir')}", "--output-dir DATA"]
    if fp.get("train_vocab"):
        parts.append(f"--train-tokenizer --vocab-size {fp['train_vocab']}")
    elif meta.get("tokenizer") != "gpt2":
        parts.append(f"--tokenizer {meta.get('tokenizer_source')}")
    if meta.get("tokenizer") != "gpt2" and meta.get("eot_token") not in (None, "<|endoftext|>"):
        parts.append(f"--eot-token '{meta['eot_token']}'")
    parts.append(f"--val-fraction {meta.get('val_fraction')} --text-column {meta.get('text_column')}")
    return " \\\n    ".join(parts)


def card(src: Source, record: dict[str, Any], tokenizer_note: str, scores: dict[str, float]) -> str:
    """The model card: what the model is, what it saw, how well it does, what it cost, how to make it again."""
    state = src.state or {}
    cfg = state.get("config") or {}
    meta = _data_meta(src)
    tok = tokenizer_info(src)
    m = src.model
    guard = state.get("budget_guard") or {}
    lines = [
        "# A Llama-architecture model trained with x1_pretrain",
        "",
        f"- Architecture: {m.n_layer} layers, width {m.d_model}, {m.n_head} heads ({m.n_kv_head} key/value), "
        f"SwiGLU {m.d_ff}, context {m.seq_len}; {record['parameters']:,} parameters (fp32 safetensors)",
        f"- Tokenizer: {tok.get('tokenizer', 'gpt2')}, {m.vocab_size:,} ids, end of text "
        f"{tok.get('eot_token', '<|endoftext|>')!r} = id {tok.get('eot_id', m.vocab_size - 1)}; "
        f"sha256 {state.get('tokenizer_sha256') or 'not recorded'}; {tokenizer_note}",
        *_data_lines(src, meta),
        f"- Trained: {_number(state.get('step'), ',')} steps, {_number(state.get('tokens_seen'), ',')} tokens, "
        f"seed {(cfg.get('train') or {}).get('seed')}, optimizer {(cfg.get('optim') or {}).get('name', 'adamw')}",
        f"- Final val loss: {_number(state.get('last_val_loss'), '.4f')} nats a token; "
        f"{_number(state.get('last_val_bpb'), '.4f')} bits per byte (comparable across tokenizers)",
    ]
    if scores:
        lines.append("- Task scores (x1's in-loop evaluation, lm-evaluation-harness's scoring):")
        lines += [f"  - {name}: {value:.4f}" for name, value in sorted(scores.items())]
    else:
        lines.append("- Task scores: none were run during training (`train.eval_tasks`)")
    spent = guard.get("spent_usd")
    lines.append(
        f"- Dollars: {_number(spent, '.2f')} spent of a {_number(guard.get('cap_usd'), '.2f')} cap (the budget "
        "guard's last reading)"
        if spent is not None
        else "- Dollars: not recorded (the run had no budget guard)"
    )
    lines += [
        "",
        "## Reproduce",
        "",
        "`x1_config.yaml` beside this card is the resolved config the run used (file, flags and `--set`).",
        "",
        "```bash",
        _tokenize_command(meta),
        "python -m x1_pretrain.train --config x1_config.yaml --data-dir DATA --ckpt-dir CKPT",
        "```",
        "",
    ]
    return "\n".join(lines)


def config_yaml(src: Source) -> str | None:
    saved = (src.state or {}).get("config")
    if not isinstance(saved, dict):
        return None
    try:
        return C.to_yaml(C.from_dict(C.upgrade(saved), "the checkpoint's config", vocab=src.model.vocab_size))
    except C.ConfigError:
        return None


def task_scores(src: Source) -> dict[str, float]:
    """The last in-loop task scores of the run (eval/<task>/acc...), read from its MLflow store; {} where the
    store is not reachable from here."""
    state = src.state or {}
    uri, run_id = state.get("mlflow_uri"), state.get("mlflow_run_id")
    if not uri or not run_id or not str(uri).startswith(("sqlite:", "file:")):
        return {}  # a tracking server may be slow or gone at export time: only a local store is read
    from ..core import names as N
    from . import runs

    try:
        run = runs.load_run(str(uri), str(run_id))
    except Exception:  # a store that moved or a server that is down: the card says none were read
        return {}
    last = {p.name: p.value for p in sorted(run.metrics, key=lambda p: (p.step, p.timestamp_ms))}
    return {k: v for k, v in last.items() if k.startswith(N.EVAL_TASK_PREFIX) and not k.endswith("/n")}
