"""Where a run starts: fresh, or from the newest complete checkpoint, after checking that the checkpoint's
run is this one (same config and data, unless ``--allow-config-change``)."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ckpt import checkpoint as ck
from ..core import config as C
from ..core.errors import RankLost, X1Error
from ..core.fileio import replace_dir, write_text_atomic
from ..core.log import Log
from ..trainer import distributed
from ..trainer.loop import LoopState
from ..trainer.optim import running_optimizer, saved_optimizer


@dataclass
class Resume:
    found: ck.Found | None = None  # the checkpoint resumed from (None: a fresh run)
    changes: list[str] = field(default_factory=list)  # config/data changes allowed by --allow-config-change

    @property
    def state(self) -> dict[str, Any]:
        return self.found.state if self.found is not None else {}


def find_resume(ckpt_dir: Path, opts: Any, cfg: C.Config, data: Any, log: Log, world_size: int = 1) -> Resume:
    """Where the run in ``ckpt_dir`` starts, as ``opts`` (the trainer's options: ``resume``,
    ``allow_config_change``, ``reset_optimizer``) ask."""
    if not opts.resume:
        existing = ck.list_step_dirs(ckpt_dir)
        if existing:
            raise X1Error(
                f"--ckpt-dir {ckpt_dir} already holds checkpoints ({existing[-1][1].name}); "
                "pass --resume-from-latest to continue that run, or choose an empty --ckpt-dir"
            )
        return Resume()
    found = ck.find_latest_complete(ckpt_dir, lambda m: log(f"warning: {m}"))
    if found is None:
        log(f"no complete checkpoint in {ckpt_dir} yet: starting fresh")
        return Resume()
    changes = check_compatible(found, cfg, data, opts.allow_config_change, log, opts.reset_optimizer)
    saved_world = int(found.state.get("world_size") or 1)
    if saved_world != world_size:
        t = cfg.train
        log(
            f"resuming {found.path.name}, written by {saved_world} rank(s), on {world_size}: the same global batch "
            f"({t.batch_size} sequences = {t.grad_accum_steps} micro-batches of {t.micro_batch_size}, "
            f"{t.grad_accum_steps // world_size} a rank) and the same sequences at every step; the weights follow "
            "an uninterrupted run to float rounding (bitwise only on the rank count and micro-batch that wrote it)"
        )
    return Resume(found, changes)


@dataclass(frozen=True)
class RankStart:
    """What one rank found before the ranks agree: its resume (or the usage error it met) and what its run is
    (the config's sha256 and the data's identity), so a node with other data or flags is refused, not averaged."""

    resume: Resume
    problem: str | None
    fingerprint: Any


def agree_on_checkpoint(mine: RankStart, ckpt_dir: Path, world: distributed.World, device: Any, log: Log) -> Resume:
    """Several ranks, perhaps on machines with disks of their own: every rank resumes the newest checkpoint any
    rank found, or all start fresh; a usage error on one rank, or a rank with another config or data, is the
    same exit 2 on every rank (never one rank gone and the others waiting). A rank whose disk lacks the
    checkpoint (another node; a new machine in place of a lost one) receives its files from the lowest rank
    that has it, over the process group, into a hidden folder, verified against their sha256 like a local
    checkpoint; rank 0 keeps its copy as a checkpoint of its own."""

    def identity(found: ck.Found | None) -> tuple[str, str] | None:
        return None if found is None else (found.path.name, (found.path / ck.DONE_FILE).read_text().strip())

    resume = mine.resume
    everyone = distributed.gather_all((identity(resume.found), mine.problem, mine.fingerprint), world)
    for rank, (_, problem, _) in enumerate(everyone):
        if problem is not None:
            raise X1Error(problem if rank == world.rank else f"rank {rank}: {problem}")
    differ = [r for r, x in enumerate(everyone) if x[2] != everyone[0][2]]
    if differ:
        raise X1Error(
            f"rank(s) {', '.join(map(str, differ))} run another config or other data than rank 0 (the "
            "config's sha256 or the data's meta.json differ): every node needs the same files and flags"
        )
    found = [x[0] for x in everyone]
    best = max((x for x in found if x is not None), key=lambda x: x[0], default=None)  # names sort by step
    if best is None:
        return Resume()
    sender = found.index(best)
    if not isinstance(best[0], str) or not ck.STEP_RE.match(best[0]):  # every rank sees the same: all stop
        raise X1Error(
            f"rank {sender} names its checkpoint {str(best[0])[:80]!r}, not a step_NNNNNNN dir: not an x1 "
            "rank of this run; check the nodes' --ckpt-dir and x1 versions"
        )
    lacking = [r for r, x in enumerate(found) if x != best]
    if not lacking:
        return resume
    if world.main:
        log(
            f"rank {sender} sends {best[0]} to rank(s) {', '.join(map(str, lacking))}, whose disk lacks it (another "
            "machine, or a new one in place of a lost one)"
        )
    dest = ckpt_dir / f".{best[0]}.pull-{os.getpid()}" if world.rank in lacking else None
    if dest is not None:
        shutil.rmtree(dest, ignore_errors=True)
    distributed.send_files(
        resume.found.path if world.rank == sender and resume.found else None, dest, world, device, sender
    )
    state, problem = ck.verify(dest) if dest is not None else (resume.state, None)
    damaged = [r for r, bad in enumerate(distributed.gather_all(problem, world)) if bad]
    if damaged:
        if dest is not None:
            shutil.rmtree(dest, ignore_errors=True)
        raise RankLost(
            f"{best[0]} reached rank(s) {', '.join(map(str, damaged))} damaged "
            f"({problem or 'see their log'}); the next launch sends it again"
        )
    if dest is None or state is None:
        return resume
    if world.main:  # rank 0 writes the run's checkpoints: the one it resumes from becomes one of them
        replace_dir(dest, ckpt_dir / best[0])
        write_text_atomic(ckpt_dir / ck.LATEST, best[0] + "\n")
        dest = ckpt_dir / best[0]
    return Resume(ck.Found(dest, int(best[0].split("_")[1]), state), resume.changes)


# What --reset-optimizer lets change: the optimizer's own keys (its state is not carried over)
OPTIMIZER_KEYS = ("optim.name", "optim.beta1", "optim.beta2", "optim.eps")


def check_compatible(
    found: ck.Found, cfg: C.Config, data: Any, allow: bool, log: Log, reset_optimizer: bool = False
) -> list[str]:
    """Differences between the checkpoint's run and this one; raises unless --allow-config-change (an optimizer
    of another ``optim.name``: unless --reset-optimizer)."""
    saved = found.state
    written_with = saved.get("tokenizer_sha256")  # None: a checkpoint from before x1 recorded it
    if written_with is not None and written_with != data.tokenizer_sha256:
        raise X1Error(
            f"{found.path} was trained on ids of the tokenizer with sha256 {written_with}; {data.directory} was "
            f"tokenized with sha256 {data.tokenizer_sha256}: the same ids mean other text, so it cannot resume\n"
            f"  hint: resume on data tokenized with the run's tokenizer (its data dir was {saved.get('data_dir')}), "
            "or start a new run (another --ckpt-dir) on this data"
        )
    changes: list[str] = []
    saved_keys = C.flatten(C.upgrade(saved.get("config", {})))
    written = saved_keys.get("optim.name", "adamw")
    if written != cfg.optim.name and not reset_optimizer:
        raise X1Error(
            f"{found.path} was written with optim.name={written}; this run has optim.name={cfg.optim.name}, "
            f"which cannot take {written}'s state\n"
            f"  hint: resume with --set optim.name={written}, or pass --reset-optimizer to keep the weights, the "
            f"step and the data position and start {cfg.optim.name} from zero moments (it drops {written}'s state)"
        )
    for key, old, new in C.diff(saved.get("config", {}), cfg.to_dict()):
        if key not in saved_keys:  # a key x1 gained after the checkpoint: what the run did without it
            old = C.BEFORE_KEY_EXISTED.get(key, C.DEFAULTS.get(key))
            if old == new:
                continue
        if reset_optimizer and (key in OPTIMIZER_KEYS or key.startswith("optim.muon_")):
            log(f"note: {key} changed from {old!r} to {new!r} since the checkpoint (allowed by --reset-optimizer)")
        elif key in C.OPERATIONAL_KEYS:
            log(f"note: {key} changed from {old!r} to {new!r} since the checkpoint (operational; allowed)")
        else:
            changes.append(f"{key}: {old!r} -> {new!r}")
    if saved.get("data_identity") != data.identity:
        changes.append(
            f"data: {data.directory}/meta.json describes other tokens than the run was trained on "
            f"(trained on {saved.get('data_dir')})"
        )
    if changes and not allow:
        lines = "\n".join(f"    {c}" for c in changes)
        raise X1Error(
            f"{found.path} was written with another configuration or data:\n{lines}\n"
            "  hint: pass --allow-config-change to resume anyway (it is logged), or use the original "
            "config and data"
        )
    for c in changes:
        log(f"warning: resuming with a change ({c}) because --allow-config-change was given")
    return changes


def dropped(state: dict[str, Any]) -> str:
    """What an optimizer state dict holds, in words: '<name> state (N tensors: exp_avg, exp_avg_sq)'."""
    parts = [state["muon"], state["adamw"]] if saved_optimizer(state) == "muon" else [state]
    names = [k for part in parts for s in part.get("state", {}).values() for k in s if k != "step"]
    return f"the {saved_optimizer(state)} state ({len(names)} tensors: {', '.join(sorted(set(names))) or 'none'})"


def _check_optimizer_shapes(optimizer: Any, where: Any) -> None:
    """load_state_dict does not compare the moments' shapes with the parameters'; a mismatch would crash at the
    first optimizer step, after the compile. A changed model.vocab_pad_multiple or model.fused_projections
    changes them while the weights still load (they are saved in Llama's layout)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for name, t in optimizer.state.get(p, {}).items():
                if hasattr(t, "shape") and t.dim() > 0 and t.shape != p.shape:
                    raise X1Error(
                        f"{where}: the optimizer's {name} has shape {tuple(t.shape)} where this model's "
                        f"parameter has {tuple(p.shape)}: model.vocab_pad_multiple or "
                        "model.fused_projections differ from the run that wrote it; resume with that "
                        "run's values (a checkpoint from before vocabulary padding: --set "
                        "model.vocab_pad_multiple=1)"
                    )


def _load_optimizer(optimizer: Any, saved: dict[str, Any], where: Path) -> None:
    written, running = saved_optimizer(saved), running_optimizer(optimizer)
    if written != running:
        raise X1Error(
            f"{where}: its optimizer state was written by {written}; this run uses {running}: resume with "
            f"--set optim.name={written}, or pass --reset-optimizer"
        )
    try:
        optimizer.load_state_dict(saved)
    except ValueError as e:
        raise X1Error(
            f"{where}: the optimizer state does not fit this run's parameter groups ({e}); "
            "optim.decay_embedding or the model changed since the checkpoint"
        ) from None


def restore(found: ck.Found, model: Any, optimizer: Any, device: Any, reset_log: Log | None = None) -> LoopState:
    """Load weights, optimizer state and RNG streams; returns the loop's counters at the checkpoint. With
    ``reset_log`` (--reset-optimizer) the optimizer state is read only to say what is dropped."""
    ck.load_model_state(model, {k: v.to(device) for k, v in ck.load_weights(found.path).items()}, found.path)
    saved = ck.load_optimizer(found.path)
    if reset_log is not None:
        reset_log(f"--reset-optimizer: {dropped(saved)} of {found.path.name} dropped; the optimizer starts from zero")
    else:
        _load_optimizer(optimizer, saved, found.path)
    _check_optimizer_shapes(optimizer, found.path)
    ck.restore_rng(found.state["rng"])
    if found.path.name.startswith("."):  # a checkpoint sent to this rank: read, no longer needed
        shutil.rmtree(found.path, ignore_errors=True)
    s = found.state
    return LoopState(
        step=s["step"],
        tokens_seen=s["tokens_seen"],
        train_time_s=s["train_time_s"],
        last_loss=s.get("last_loss", math.nan),
        last_val_loss=s.get("last_val_loss", math.nan),
        last_val_bpb=s.get("last_val_bpb", math.nan),
    )
