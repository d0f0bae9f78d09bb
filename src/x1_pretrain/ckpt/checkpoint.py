"""Atomic checkpoints: ``step_<7 digits>/`` with ``model.safetensors`` (fp32 master weights under
transformers-Llama names), the optimizer state as ``optimizer.safetensors`` (every tensor, by its place in the
state dict) + ``optimizer.json`` (the rest: param groups, scalars), ``trainer_state.json`` and a ``DONE`` marker
written last.

A checkpoint is written into a hidden temporary directory, fsynced, and renamed into place; only then
is ``latest`` (a one-line text file naming the directory) replaced. A directory without ``DONE``, or
whose files fail the sha256 recorded in its ``trainer_state.json``, does not exist for resume.
Loading unpickles nothing: a checkpoint may come from a bucket or another rank. The ``optimizer.pt`` of older
x1 checkpoints is read only where torch is 2.6 or later (``torch.load(weights_only=True)`` before 2.6 can run
code from a crafted file: CVE-2025-32434); older torch is refused with the fix.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import X1Error
from ..core.fileio import OutsideFolder, inside, pid_alive, replace_dir, sha256_file, write_text_atomic
from ..core.fileio import fsync_dir as _fsync_dir

if TYPE_CHECKING:
    import torch

# numpy, torch and the safetensors writer are imported where a tensor is touched: the watchdog reads and writes
# this module's small files (latest, progress, exit status) and starts in a tenth of the time without torch.

STEP_RE = re.compile(r"^step_(\d{7})$")
MODEL_FILE, OPTIM_FILE, OPTIM_META, STATE_FILE, DONE_FILE, PIN_FILE = (
    "model.safetensors",
    "optimizer.safetensors",
    "optimizer.json",
    "trainer_state.json",
    "DONE",
    "PIN",
)
LEGACY_OPTIM = "optimizer.pt"  # x1 before the safetensors optimizer: read only on torch >= 2.6
LATEST, FINAL_MODEL, FINAL_OPTIM, FINAL_OPTIM_META = (
    "latest",
    "final.safetensors",
    "final-optimizer.safetensors",
    "final-optimizer.json",
)
FINAL_OPTIM_PT = "final-optimizer.pt"  # the lab's shutdown list names it: written here, never read by x1
OPTIM_FORMAT = "x1-optimizer/1"
SAFE_TORCH_LOAD = (2, 6)  # the first torch whose weights_only=True load is safe (CVE-2025-32434)


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


# --- RNG state as JSON ------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    py = random.getstate()
    np_state: Any = np.random.get_state()
    out: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "cuda": [],
    }
    if torch.cuda.is_available():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if state.get("cuda") and torch.cuda.is_available():
        states = [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]]
        torch.cuda.set_rng_state_all(states[: torch.cuda.device_count()])


# --- snapshots and writing --------------------------------------------------------------------------
def to_cpu(obj: Any) -> Any:
    """Deep copy with every tensor moved to (or cloned on) the CPU, so training can go on meanwhile."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


# --- optimizer state without pickle: tensors in safetensors, the rest in JSON ---------------------------------
def flatten_optimizer(state: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors by a name that is their place in ``state``, the JSON of everything else). Tuples, dicts with
    non-string keys (the parameter ids) and tensors are spelled so that ``unflatten_optimizer`` gives back the
    same structure, the same dtypes and the same bits."""
    import torch

    tensors: dict[str, torch.Tensor] = {}

    def enc(obj: Any, where: str) -> Any:
        if isinstance(obj, torch.Tensor):
            if where in tensors:
                raise ValueError(f"optimizer state: two tensors at {where}")
            tensors[where] = obj
            return {"__tensor__": where}
        if isinstance(obj, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in obj):
                return {k: enc(v, f"{where}/{k}") for k, v in obj.items()}
            for k in obj:
                if isinstance(k, bool) or not isinstance(k, (int, str)):
                    raise TypeError(f"optimizer state: key {k!r} at {where} is neither int nor str")
            return {"__items__": [[k, enc(v, f"{where}/{k}")] for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            items = [enc(v, f"{where}/{i}") for i, v in enumerate(obj)]
            return {"__tuple__": items} if isinstance(obj, tuple) else items
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise TypeError(f"optimizer state: {type(obj).__name__} at {where} cannot be stored without pickle")

    return tensors, {"format": OPTIM_FORMAT, "state_dict": enc(state, "o")}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: Any, where: Path) -> dict[str, Any]:
    """The optimizer's state dict from ``flatten_optimizer``'s two parts; a part that does not fit is X1Error."""
    if not isinstance(meta, dict) or meta.get("format") != OPTIM_FORMAT:
        raise X1Error(
            f"{where}: not x1 optimizer state (format {OPTIM_FORMAT}); the checkpoint is damaged or "
            "not x1's: resume from another one"
        )

    def dec(obj: Any) -> Any:
        if isinstance(obj, list):
            return [dec(v) for v in obj]
        if not isinstance(obj, dict):
            return obj
        if set(obj) == {"__tensor__"}:
            if obj["__tensor__"] not in tensors:
                raise X1Error(
                    f"{where}: the optimizer state names a tensor {str(obj['__tensor__'])[:80]!r} its "
                    "safetensors file lacks; the checkpoint is damaged: resume from another one"
                )
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__tuple__"} and isinstance(obj["__tuple__"], list):
            return tuple(dec(v) for v in obj["__tuple__"])
        if set(obj) == {"__items__"} and isinstance(obj["__items__"], list):
            return {k: dec(v) for k, v in obj["__items__"]}
        return {k: dec(v) for k, v in obj.items()}

    try:
        out = dec(meta.get("state_dict"))
    except (TypeError, ValueError) as e:
        raise X1Error(f"{where}: the optimizer state cannot be read ({e}); resume from another checkpoint") from None
    if not isinstance(out, dict):
        raise X1Error(f"{where}: the optimizer state is not a state dict; resume from another checkpoint")
    return out


def _torch_version() -> tuple[int, int]:
    import torch

    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _load_legacy_optimizer(path: Path, map_location: Any) -> dict[str, Any]:
    """An ``optimizer.pt`` of an older x1 checkpoint: a pickle, read only where torch's guard holds."""
    import torch

    if _torch_version() < SAFE_TORCH_LOAD:
        raise X1Error(
            f"{path}: this checkpoint's optimizer state is a pickle ({LEGACY_OPTIM}, written by an older "
            f"x1): it cannot be loaded safely with torch {torch.__version__}: before 2.6, "
            "torch.load(weights_only=True) can run code hidden in the file (CVE-2025-32434), and a "
            "checkpoint may come from a bucket or another machine. Fix: resume this checkpoint once "
            "with torch >= 2.6 (the next checkpoint is written as optimizer.safetensors + "
            "optimizer.json, which any torch reads), or resume from a checkpoint this x1 wrote"
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a pickle that is not plain tensors/containers is refused here
        raise X1Error(f"{path}: optimizer state cannot be loaded safely ({type(e).__name__}: {e})") from None


def save_optimizer(state: dict[str, Any], tensors_path: Path, meta_path: Path) -> dict[str, str]:
    """Write the optimizer state as safetensors + JSON (each fsynced); returns {file name: sha256}."""
    from ..core import safetensors_io

    tensors, meta = flatten_optimizer(state)
    out = {tensors_path.name: safetensors_io.save(tensors, tensors_path, {"format": "pt"})}
    with open(meta_path, "w") as f:
        f.write(json.dumps(meta, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    out[meta_path.name] = sha256_file(meta_path)
    return out


@dataclass
class StepSnapshot:
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    state: dict[str, Any]  # trainer_state.json without the file hashes


def write_step_dir(ckpt_dir: Path, snap: StepSnapshot) -> tuple[Path, int]:
    """Write one complete checkpoint directory atomically. Returns (path, bytes written)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / step_dir_name(snap.step)
    tmp = ckpt_dir / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _fill_step_dir(tmp, snap)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (a full disk) leaves nothing half-written behind
        raise
    replace_dir(tmp, final)  # the same step may be saved again (e.g. a stop right after a periodic save)
    _fsync_dir(ckpt_dir)
    try:
        write_text_atomic(ckpt_dir / LATEST, final.name + "\n")
    except OSError:
        # a full disk can refuse even these few bytes: the step dir goes (its space freed), the previous one
        # stays ``latest`` and the newest complete checkpoint, as after any failed write
        if read_latest(ckpt_dir) != final.name:
            shutil.rmtree(final, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in final.iterdir())
    return final, size


def _fill_step_dir(tmp: Path, snap: StepSnapshot) -> None:
    from ..core import safetensors_io

    files = {MODEL_FILE: safetensors_io.save(snap.model, tmp / MODEL_FILE, {"format": "pt"})}
    files |= save_optimizer(snap.optimizer, tmp / OPTIM_FILE, tmp / OPTIM_META)
    state = {**snap.state, "files": files}
    state_text = json.dumps(state, indent=1, sort_keys=True)
    with open(tmp / STATE_FILE, "w") as f:
        f.write(state_text)
        f.flush()
        os.fsync(f.fileno())
    with open(tmp / DONE_FILE, "w") as f:  # last: names the state file's hash
        f.write(hashlib.sha256(state_text.encode()).hexdigest() + "\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)


def write_final_files(ckpt_dir: Path, step_dir: Path) -> dict[str, str]:
    """The final files beside the step dirs (the lab's shutdown list): ``final.safetensors``, the optimizer as
    ``final-optimizer.safetensors`` + ``final-optimizer.json`` (what x1 reads), and ``final-optimizer.pt``, the
    name the lab's checklist gives, written by ``torch.save`` from that state (plain tensors and containers)
    for tools that want one file; x1 never reads it."""
    pairs = [(MODEL_FILE, FINAL_MODEL)]
    legacy = not (step_dir / OPTIM_FILE).is_file() and (step_dir / LEGACY_OPTIM).is_file()
    pairs += [(LEGACY_OPTIM, FINAL_OPTIM_PT)] if legacy else [(OPTIM_FILE, FINAL_OPTIM), (OPTIM_META, FINAL_OPTIM_META)]
    out = {}
    for src, name in pairs:
        tmp = ckpt_dir / f".{name}.tmp-{os.getpid()}"
        try:
            shutil.copyfile(step_dir / src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, ckpt_dir / name)
        finally:
            tmp.unlink(missing_ok=True)  # left only by a failed copy (a full disk): its space is freed
        out[name] = sha256_file(ckpt_dir / name)
    if not legacy:
        out[FINAL_OPTIM_PT] = _write_final_pt(ckpt_dir, step_dir)
    _fsync_dir(ckpt_dir)
    return out


def _write_final_pt(ckpt_dir: Path, step_dir: Path) -> str:
    """``final-optimizer.pt`` from the step dir's safetensors optimizer state; returns its sha256."""
    import torch

    tmp = ckpt_dir / f".{FINAL_OPTIM_PT}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(load_optimizer(step_dir), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ckpt_dir / FINAL_OPTIM_PT)
    finally:
        tmp.unlink(missing_ok=True)  # left only by a failed write (a full disk): its space is freed
    return sha256_file(ckpt_dir / FINAL_OPTIM_PT)


def prune(ckpt_dir: Path, keep_last: int) -> list[Path]:
    """Delete complete step dirs beyond the newest ``keep_last`` (never a pinned one, never ``latest``)."""
    dirs = list_step_dirs(ckpt_dir)
    complete = [(s, p) for s, p in dirs if (p / DONE_FILE).is_file()]
    latest = read_latest(ckpt_dir)
    removed = []
    for _, p in complete[:-keep_last]:
        if (p / PIN_FILE).exists() or p.name == latest:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for stale in [*ckpt_dir.glob(".step_*.tmp-*"), *ckpt_dir.glob(".step_*.pull-*")]:  # a process killed mid-write
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return removed

    return True


# --- finding and loading ----------------------------------------------------------------------------
def list_step_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name))]
    return sorted(out)


def read_latest(ckpt_dir: Path) -> str | None:
    try:
        return (ckpt_dir / LATEST).read_text().strip() or None
    except OSError:
        return None


_NONE = type(None)
# the fields of trainer_state.json that x1 reads, and the JSON types each may have (a checkpoint may come from a
# bucket or another rank: a wrong type must make it invalid, never crash the resume)
_STATE_TYPES: dict[str, tuple[type, ...]] = {
    "tokens_seen": (int,),
    "train_time_s": (int, float),
    "wall_clock_s": (int, float),
    "last_loss": (int, float),
    "last_val_loss": (int, float),
    "last_val_bpb": (int, float),
    "world_size": (int,),
    "rng": (dict,),
    "config": (dict,),
    "data_position": (dict,),
    "machine": (dict, _NONE),
    "config_sha256": (str,),
    "budget_guard": (dict, _NONE),
    "budget": (dict, _NONE),
    "schedule": (dict, _NONE),
    "spike": (dict, _NONE),
    "mlflow_run_id": (str, _NONE),
    "mlflow_uri": (str, _NONE),
    "data_dir": (str, _NONE),
    "tokenizer_sha256": (str, _NONE),
    "tokenizer": (dict, _NONE),
}
_RNG_TYPES: dict[str, tuple[type, ...]] = {"python": (list,), "numpy": (list,), "torch": (str,), "cuda": (list,)}
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_DIR_STEP_RE = re.compile(r"^\.?step_(\d{7})(?:$|\.)")  # a step dir, or its hidden pull/transfer folder


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def state_problem(state: Any, path: Path) -> str | None:
    """Why a decoded ``trainer_state.json`` is not one x1 wrote, or None: an object whose ``step`` is an integer
    (the step of its folder's name), whose ``files`` map names inside the folder (``fileio.inside``) to sha256
    digests, and whose other fields x1 reads have their types."""
    if not isinstance(state, dict):
        return f"{STATE_FILE} is a JSON {type(state).__name__}, not an object"
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"{STATE_FILE}: step is {step!r}, not an integer of 0 or more"
    m = _DIR_STEP_RE.match(path.name)
    if m and int(m.group(1)) != step:
        return f"{STATE_FILE}: step {step} in the folder of step {int(m.group(1))}"
    bad = [k for k, types in _STATE_TYPES.items() if k in state and not _typed(state[k], types)]
    bad += [
        f"rng.{k}"
        for k, types in _RNG_TYPES.items()
        if isinstance(state.get("rng"), dict) and k in state["rng"] and not _typed(state["rng"][k], types)
    ]
    if bad:
        return f"{STATE_FILE}: {', '.join(bad)} of the wrong type"
    files = state.get("files")
    if not isinstance(files, dict):
        return f"{STATE_FILE}: files is {type(files).__name__}, not an object of file name to sha256"
    for name, digest in files.items():
        try:
            inside(path, name, f"{STATE_FILE} names the file")
        except OutsideFolder as e:
            return str(e)
        if not isinstance(digest, str) or not _SHA256_RE.match(digest):
            return f"{STATE_FILE}: the sha256 of {name} is {digest!r}, not 64 hex digits"
    return None


def verify(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(trainer state, None) when the checkpoint is complete and intact, else (None, the problem): a state file
    that is not one x1 wrote (``state_problem``) makes it invalid, like a failed hash."""
    if not (path / DONE_FILE).is_file():
        return None, "no DONE marker (the write was interrupted)"
    try:
        state_text = (path / STATE_FILE).read_text()
        state = json.loads(state_text)
        done = (path / DONE_FILE).read_text().strip()
    except (OSError, ValueError, RecursionError) as e:
        return None, f"{STATE_FILE} unreadable ({type(e).__name__}: {e})"
    if hashlib.sha256(state_text.encode()).hexdigest() != done:
        return None, f"{STATE_FILE} does not match the hash in DONE"
    problem = state_problem(state, path)
    if problem is not None:
        return None, problem
    for name, digest in state["files"].items():
        f = path / name
        if not f.is_file():
            return None, f"{name} is missing"
        if sha256_file(f) != digest:
            return None, f"{name} fails its recorded sha256 (corrupted on disk?)"
    return state, None


@dataclass
class Found:
    path: Path
    step: int
    state: dict[str, Any]


def find_latest_complete(ckpt_dir: Path, warn: Callable[[str], None]) -> Found | None:
    """The newest checkpoint that verifies; every skipped one is named in a warning."""
    for step, path in reversed(list_step_dirs(ckpt_dir)):
        state, problem = verify(path)
        if state is None:
            warn(f"skipping checkpoint {path}: {problem}")
            continue
        return Found(path, step, state)
    return None


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    from ..core import safetensors_io

    return safetensors_io.load(path / MODEL_FILE if path.is_dir() else path)


def load_optimizer(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The optimizer state of a step dir (or of its ``.safetensors`` file, or a final one, with the ``.json`` of
    the same stem beside it); an ``optimizer.pt`` of an older checkpoint only where torch is >= 2.6."""
    from ..core import safetensors_io

    if path.is_dir():
        if not (path / OPTIM_FILE).is_file() and (path / LEGACY_OPTIM).is_file():
            return _load_legacy_optimizer(path / LEGACY_OPTIM, map_location)
        tensors_path, meta_path = path / OPTIM_FILE, path / OPTIM_META
    elif path.suffix == ".safetensors":
        tensors_path, meta_path = path, path.with_suffix(".json")
    else:
        return _load_legacy_optimizer(path, map_location)
    try:
        meta = json.loads(meta_path.read_text())
        tensors = safetensors_io.load(tensors_path)
    except (OSError, ValueError) as e:
        raise X1Error(
            f"{tensors_path}: optimizer state cannot be read ({type(e).__name__}: {e}); resume from another checkpoint"
        ) from None
    except Exception as e:  # the safetensors library's own error for a damaged file
        raise X1Error(
            f"{tensors_path}: not a readable safetensors file ({type(e).__name__}: {e}); resume from another checkpoint"
        ) from None
    if map_location not in (None, "cpu"):
        tensors = {k: v.to(map_location) for k, v in tensors.items()}
    return unflatten_optimizer(tensors, meta, tensors_path)


def load_model_state(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: Path) -> None:
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = getattr(getattr(model, "config", None), "tie_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise X1Error(
            f"{where}: weights do not fit this model (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}); was the config changed?"
        )


def guard_snapshot(state: dict[str, Any]) -> dict[str, Any] | None:
    """The budget guard's snapshot a checkpoint's trainer_state.json holds (``budget`` before it was renamed
    ``budget_guard``), or None."""
    snap = state.get("budget_guard", state.get("budget"))
    return snap if isinstance(snap, dict) else None
