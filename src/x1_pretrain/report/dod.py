"""The lab's six Definition-of-Done checks on an exported bundle, each a pure function of the files in it
(no MLflow); ``dod.py`` is the command and lists them."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget.planner import chinchilla_loss

EXIT_FAILED = 1
POSTMORTEM = "spike-postmortem.md"
PROOF_SUFFIXES = {".png": b"\x89PNG\r\n\x1a\n", ".jpg": b"\xff\xd8\xff", ".jpeg": b"\xff\xd8\xff", ".pdf": b"%PDF"}


@dataclass(frozen=True)
class Check:
    id: int
    check: str
    passed: bool
    evidence: str


def _get(d: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _money(x: float) -> str:
    return f"${x:,.2f}"


def load_manifest(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    path = run_dir / "manifest.json"
    if not path.is_file():
        return None, f"{path} not found: run python -m x1_pretrain.export_run --output {run_dir}"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{path} is not readable JSON ({e})"
    if not isinstance(data, dict):
        return None, f"{path} does not hold a JSON object"
    return data, ""


def check_manifest(m: dict[str, Any] | None, why: str) -> Check:
    name = "manifest: seed, versions, cluster, $ spent"
    if m is None:
        return Check(1, name, False, why)
    missing = []
    if not isinstance(m.get("seed"), int):
        missing.append("seed")
    versions: dict[str, Any] = m["versions"] if isinstance(m.get("versions"), dict) else {}
    if not versions.get("torch") or not versions.get("python"):
        missing.append("versions (python, torch)")
    cluster: dict[str, Any] = m["cluster"] if isinstance(m.get("cluster"), dict) else {}
    if not cluster.get("hostname") or not (cluster.get("gpu_name") or cluster.get("cpu_count")):
        missing.append("cluster (hostname and GPU or CPU)")
    spent = _get(m, "dollars.spent_usd")
    if not isinstance(spent, (int, float)) or spent < 0:
        source = _get(m, "dollars.source")
        missing.append("dollars.spent_usd" + (f" ({source})" if source else ""))
    if missing:
        return Check(1, name, False, "manifest.json lacks " + "; ".join(missing))
    gpu = (
        f"{cluster.get('gpu_count') or 1}x {cluster['gpu_name']}"
        if cluster.get("gpu_name")
        else f"CPU, {cluster.get('cpu_count')} cores"
    )
    return Check(
        1,
        name,
        True,
        f"seed {m['seed']}; torch {versions['torch']}, flash-attn "
        f"{versions.get('flash_attn') or 'none'}; {gpu} on {cluster['hostname']}; "
        f"{_money(spent)} spent",
    )


def check_val_loss(m: dict[str, Any] | None, band: tuple[float, float]) -> Check:
    lo, hi = band
    name = f"final val loss in [{lo:.2f}, {hi:.2f}]"
    val = _get(m, "loss.final_val")
    if not isinstance(val, (int, float)):
        return Check(2, name, False, "no final val loss in manifest.json (loss.final_val)")
    step = _get(m, "loss.final_val_step")
    at = f" at step {step:,}" if isinstance(step, int) else ""
    bpb = _get(m, "loss.final_val_bpb")
    at += f" ({bpb:.4f} bits per byte)" if isinstance(bpb, (int, float)) else ""
    if lo <= val <= hi:
        return Check(2, name, True, f"val loss {val:.4f}{at}")
    side = "above" if val > hi else "below"
    return Check(
        2,
        name,
        False,
        f"val loss {val:.4f}{at} is {side} the band: see theory/04, check for spikes, write the post-mortem",
    )


def check_weights(run_dir: Path, m: dict[str, Any] | None) -> Check:
    from ..ckpt.checkpoint import MODEL_FILE
    from ..core import safetensors_io
    from ..core.fileio import sha256_file

    name = "final.safetensors reloads byte-identically"
    path = run_dir / "final.safetensors"
    if not path.is_file():
        return Check(3, name, False, f"{path.name} not found in {run_dir}")
    try:
        tensors = safetensors_io.load(path)
        meta = safetensors_io.metadata(path)
    except Exception as e:  # the library raises several types for a damaged file
        return Check(3, name, False, f"{path.name} does not load ({type(e).__name__}: {str(e)[:120]})")
    digest = sha256_file(path)
    with tempfile.TemporaryDirectory(prefix="x1-dod-") as tmp:
        again = safetensors_io.save(tensors, Path(tmp) / "resaved.safetensors", meta)
    if again != digest:
        return Check(
            3,
            name,
            False,
            f"re-saving the {len(tensors)} loaded tensors gives other bytes (sha256 {again[:12]} vs {digest[:12]})",
        )
    source = _get(m, "final_weights.source_sha256")
    origin = _get(m, "final_weights.source_checkpoint") or "its source checkpoint"
    if not source:
        return Check(
            3,
            name,
            False,
            "round trip is byte-identical, but manifest.json does not say which checkpoint "
            "it came from (final_weights.source_sha256)",
        )
    if digest != source:
        return Check(
            3,
            name,
            False,
            f"round trip is byte-identical, but sha256 {digest[:12]} is not {origin}'s "
            f"model.safetensors ({str(source)[:12]})",
        )
    src_dir = Path(str(_get(m, "final_weights.source_path") or ""))
    if src_dir.name and (src_dir / MODEL_FILE).is_file():
        import torch

        theirs = safetensors_io.load(src_dir / MODEL_FILE)
        same = theirs.keys() == tensors.keys() and all(torch.equal(theirs[k], tensors[k]) for k in tensors)
        if not same:
            return Check(3, name, False, f"tensors differ from {src_dir / MODEL_FILE}")
        how = f"tensor-for-tensor equal to {src_dir / MODEL_FILE}"
    else:
        how = f"sha256 equals the one {origin}'s trainer_state.json recorded (the step dir is not on this machine)"
    return Check(3, name, True, f"{len(tensors)} tensors, re-saved byte-identically (sha256 {digest[:12]}); {how}")


def check_spend(m: dict[str, Any] | None, cap: float) -> Check:
    name = f"total spend <= {_money(cap)}"
    spent = _get(m, "dollars.spent_usd")
    if not isinstance(spent, (int, float)):
        source = _get(m, "dollars.source")
        return Check(4, name, False, "spend not recorded in manifest.json" + (f": {source}" if source else ""))
    source = _get(m, "dollars.source") or "manifest.json"
    ok = spent <= cap
    fitted = ""
    if _get(m, "progress.budget_fit") or _get(m, "progress.fit_to_budget"):  # the second: older bundles
        fitted = (
            f"; fitted to the budget: {_get(m, 'progress.steps')} steps of at most "
            f"{_get(m, 'progress.total_steps')}, annealed from step {_get(m, 'progress.decay_start_step')}"
        )
    return Check(4, name, ok, f"{_money(spent)} {'<=' if ok else '>'} {_money(cap)} (from {source}){fitted}")


def check_postmortem(run_dir: Path) -> Check:
    name = f"{POSTMORTEM} written"
    path = run_dir / POSTMORTEM
    if not path.is_file():
        return Check(
            5,
            name,
            False,
            f"{POSTMORTEM} not found in {run_dir}: draft it from the run's spike (real, or "
            "injected with --inject-spike-at-step 12000) with python -m "
            f"x1_pretrain.postmortem --mlflow-uri URI --output {path}, then finish it by hand",
        )
    try:
        text = path.read_text(errors="replace").strip()
    except OSError as e:
        return Check(5, name, False, f"{POSTMORTEM} is not readable ({e.strerror})")
    if not text:
        return Check(5, name, False, f"{POSTMORTEM} is empty")
    first = text.splitlines()[0].strip()[:60]
    return Check(5, name, True, f"{len(text.split()):,} words; begins {first!r}")


def find_proof(run_dir: Path, name: str | None) -> list[Path]:
    if name:
        p = Path(name)
        return [p if p.is_absolute() else run_dir / p]
    return sorted(
        p
        for p in run_dir.iterdir()
        if p.is_file() and p.name.lower().startswith("termination") and p.suffix.lower() in PROOF_SUFFIXES
    )


def check_termination(run_dir: Path, name: str | None) -> Check:
    title = "instance terminated (screenshot)"
    candidates = find_proof(run_dir, name)
    if not candidates:
        return Check(
            6,
            title,
            False,
            f"no termination*.png|jpg|jpeg|pdf in {run_dir}: save the provider dashboard's "
            "screenshot of the terminated instance there (or name it with "
            "--termination-proof)",
        )
    problems = []
    for p in candidates:
        if not p.is_file():
            problems.append(f"{p} not found")
            continue
        magic = PROOF_SUFFIXES.get(p.suffix.lower())
        head = p.read_bytes()[:8]
        if p.stat().st_size == 0:
            problems.append(f"{p.name} is empty")
        elif magic is not None and not head.startswith(magic):
            problems.append(f"{p.name} is not a {p.suffix.lstrip('.').upper()} file")
        else:
            return Check(6, title, True, f"{p.name} ({p.stat().st_size:,} bytes)")
    return Check(6, title, False, "; ".join(problems))


def run_checks(run_dir: Path, band: tuple[float, float], cap: float, proof: str | None) -> list[Check]:
    m, why = load_manifest(run_dir)
    return [
        check_manifest(m, why),
        check_val_loss(m, band),
        check_weights(run_dir, m),
        check_spend(m, cap),
        check_postmortem(run_dir),
        check_termination(run_dir, proof),
    ]


def table(checks: list[Check], run_dir: Path) -> str:
    width = max(len(c.check) for c in checks)
    lines = [f"Definition of Done: {run_dir}", f"  #  {'check':<{width}}  result  evidence"]
    for c in checks:
        lines.append(f"  {c.id}  {c.check:<{width}}  {'PASS' if c.passed else 'FAIL'}    {c.evidence}")
    n = sum(c.passed for c in checks)
    lines.append(f"{n}/{len(checks)} checks pass" + ("" if n == len(checks) else ": not done"))
    return "\n".join(lines)


def _tokens(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


LAB_TOKENS = 84_000 * 524_288  # what the lab's band was written for: 84,000 steps of 512 x 1024 tokens


def notes(m: dict[str, Any] | None, band: tuple[float, float]) -> list[str]:
    """Beside the six checks, for information: the run's task scores, and the val loss Hoffmann et al.'s fit
    (plan's prediction) gives for the tokens this run trained, against the band written for the lab's 84,000
    steps (docs/errata.md, 2: they do not fit the cap)."""
    out: list[str] = []
    evals = _get(m, "evals.tasks")
    if isinstance(evals, dict) and evals:
        parts = []
        for task, e in evals.items():
            norm = f", acc_norm {e['acc_norm']:.4f}" if isinstance(e.get("acc_norm"), (int, float)) else ""
            split = f" {e['split']}" if e.get("split") else ""  # n: the items scored, on that split
            parts.append(
                f"{task} acc {e.get('acc', float('nan')):.4f}{norm} (n={e.get('n')}{split}, step {e.get('step')})"
            )
        out.append(
            "task scores (information, not a check; zero-shot, lm-evaluation-harness protocol): " + "; ".join(parts)
        )
    tokens, n_params = _get(m, "progress.tokens"), _get(m, "parameters.non_embedding")
    if isinstance(tokens, (int, float)) and tokens > 0 and isinstance(n_params, (int, float)) and n_params > 0:
        lo, hi = band
        predicted, lab = chinchilla_loss(n_params, tokens), chinchilla_loss(n_params, LAB_TOKENS)
        where = "inside" if lo <= predicted <= hi else ("above" if predicted > hi else "below")
        out.append(
            f"the band [{lo:.2f}, {hi:.2f}] was written for the lab's 84,000 steps ({LAB_TOKENS / 1e9:.1f}B "
            f"tokens; plan predicts {lab:.2f} there); this run trained {_tokens(tokens)} tokens, for which "
            f"plan predicts {predicted:.2f} (Hoffmann et al.'s fit, N = {n_params / 1e6:.1f}M non-embedding "
            f"parameters): {where} the band"
            + (
                ""
                if where == "inside"
                else ", so a val loss outside it may be what these tokens buy, not a fault of the run"
            )
        )
    return out
