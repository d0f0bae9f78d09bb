"""Find the weights and the model config that a ``--checkpoint`` argument names, and load them.

Accepted forms (the first that applies wins):

* a step dir ``step_NNNNNNN/`` (``model.safetensors`` + ``trainer_state.json``, which holds the resolved
  config under ``"config"``); it must be complete (``DONE`` and its recorded hashes);
* a checkpoint dir: its newest complete step dir (what ``latest`` names), else its ``final.safetensors``;
* a ``.safetensors`` file (``final.safetensors`` or a step dir's ``model.safetensors``): the config comes
  from the step dir holding it, else from the newest complete sibling step dir.

``--config FILE`` (with ``--set`` overrides) replaces the checkpoint's config; it is required when no
``trainer_state.json`` can be found. Used by ``export_hf`` and ``sample``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..ckpt import checkpoint as ck
from ..core import config as C
from ..core.errors import X1Error

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from ..model.transformer import Transformer

Warn = Callable[[str], None]


def _stderr(msg: str) -> None:
    _log.warning(msg)


CONFIG_HINT = "pass --config configs/x1-50m-a100.yaml (the config the run was trained with)"


@dataclass(frozen=True)
class Source:
    weights: Path  # the .safetensors file to read
    model: C.ModelConfig
    state: dict[str, Any] | None  # trainer_state.json of the step dir, when one was found
    config_from: str  # where the model config came from, for messages

    @property
    def step(self) -> int | None:
        return None if self.state is None else self.state.get("step")

    def describe(self) -> str:
        step = f"step {self.step}" if self.step is not None else "step unknown"
        return f"{self.weights} ({step}; config from {self.config_from})"


def _complete_step_dir(path: Path) -> dict[str, Any]:
    state, problem = ck.verify(path)
    if state is None:
        raise X1Error(
            f"--checkpoint {path}: not a complete checkpoint: {problem}. Name a complete step dir, "
            "or the checkpoint dir to use its newest complete one"
        )
    return state


def _newest_state(ckpt_dir: Path, warn: Warn) -> tuple[Path, dict[str, Any]] | None:
    found = ck.find_latest_complete(ckpt_dir, warn)
    return None if found is None else (found.path, found.state)


def locate(path: Path, warn: Warn = _stderr) -> tuple[Path, dict[str, Any] | None, str]:
    """(weights file, trainer state or None, where that state came from) for ``--checkpoint path``."""
    if not path.exists():
        raise X1Error(
            f"--checkpoint {path}: no such file or directory (expected a step_NNNNNNN/ dir, a "
            "checkpoint dir or a .safetensors file)"
        )
    if path.is_dir():
        if (path / ck.MODEL_FILE).is_file() or (path / ck.STATE_FILE).is_file():
            return path / ck.MODEL_FILE, _complete_step_dir(path), str(path / ck.STATE_FILE)
        newest = _newest_state(path, warn)
        if newest is not None:
            step_dir, state = newest
            return step_dir / ck.MODEL_FILE, state, str(step_dir / ck.STATE_FILE)
        if (path / ck.FINAL_MODEL).is_file():
            return path / ck.FINAL_MODEL, None, ""
        raise X1Error(
            f"--checkpoint {path}: holds no complete step_NNNNNNN/ dir and no {ck.FINAL_MODEL}; "
            "is it the --ckpt-dir the trainer wrote to?"
        )
    if path.suffix != ".safetensors":
        raise X1Error(
            f"--checkpoint {path}: a file must be a .safetensors file (final.safetensors or a step "
            "dir's model.safetensors)"
        )
    if path.name == ck.MODEL_FILE and (path.parent / ck.STATE_FILE).is_file():
        return path, _complete_step_dir(path.parent), str(path.parent / ck.STATE_FILE)
    newest = _newest_state(path.parent, warn)
    if newest is not None:
        step_dir, state = newest
        return path, state, str(step_dir / ck.STATE_FILE)
    return path, None, ""


def _weights_vocab(weights: Path) -> int | None:
    """The embedding's rows in a weights file (what ``model.vocab_size: auto`` means for it), read from the
    header only."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), "pt") as f:
            name = next((k for k in f.keys() if k.endswith("embed_tokens.weight")), None)  # noqa: SIM118
            return int(f.get_slice(name).get_shape()[0]) if name else None
    except Exception:  # a damaged file is reported, by name, where its weights are loaded
        return None


def resolve(path: Path, config_file: Path | None = None, sets: list[str] | None = None, warn: Warn = _stderr) -> Source:
    weights, state, state_from = locate(path, warn)
    if config_file is not None:
        return Source(
            weights, C.load(config_file, sets=sets, vocab=_weights_vocab(weights)).model, state, str(config_file)
        )
    if sets:
        raise X1Error("--set needs --config (the overrides apply to that file)")
    saved = state.get("config") if state is not None else None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        where = (
            f"{state_from} has no resolved config"
            if state is not None
            else f"no trainer_state.json was found beside {weights}"
        )
        raise X1Error(f"--checkpoint {path}: {where}; {CONFIG_HINT}")
    # Only the model section matters here; the other sections may come from another x1 version.
    return Source(weights, C.from_dict({"model": saved["model"]}, state_from).model, state, state_from)


def load_weights(src: Source) -> dict[str, torch.Tensor]:
    try:
        return ck.load_weights(src.weights)
    except Exception as e:  # safetensors raises its own error types for a truncated or foreign file
        raise X1Error(f"{src.weights}: cannot be read as safetensors ({type(e).__name__}: {e})") from None


def load_model(src: Source, device: Any = "cpu") -> Transformer:
    """An x1 ``Transformer`` with the checkpoint's weights, in eval mode on ``device``."""
    import torch

    from ..model.transformer import Transformer

    weights = load_weights(src)
    model = Transformer(src.model)
    try:
        ck.load_model_state(model, weights, src.weights)
    except RuntimeError as e:  # shape mismatches
        lines = str(e).strip().splitlines()
        detail = next((ln.strip() for ln in lines if "size mismatch" in ln), lines[0] if lines else "")
        raise X1Error(
            f"{src.weights}: the weights do not fit the model config from {src.config_from} ({detail}); {CONFIG_HINT}"
        ) from None
    return model.to(torch.device(device)).eval()
