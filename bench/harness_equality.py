"""x1's task scorer against EleutherAI's lm-evaluation-harness 0.4: the same scores and the speed, in one run.

    .venv/bin/python bench/harness_equality.py [--checkpoint demo-run/checkpoints] [--limit 200] [--batch-size 32]

One checkpoint, the same items: x1 scores the first ``--limit`` items of each task with
``evals.run.evaluate_model`` (what ``python -m x1_pretrain.evaluate`` runs); the harness (``lm_eval==0.4.13``,
its ``hf`` model) scores the checkpoint's HF export (``python -m x1_pretrain.export_hf`` into a temp dir) on
task YAMLs that ``include:`` the harness's own hellaswag / arc / piqa / winogrande definitions and only swap the
dataset for the SAME hash-checked arrow file x1 reads (``dataset_path: arrow``), offline (``HF_*_OFFLINE=1``).

Compared per task: n, acc, acc_norm; per item: the (context, continuation) strings of every choice, the gold
index, and the largest |log-likelihood difference| over the continuations (x1's ``Scorer.logliks`` against the
harness's logged ``filtered_resps``). An item scored differently counts as a float tie when its two choices'
values are within ``--tie`` on either side; any other difference makes the exit status 1. An item with a
continuation longer than the model's context (``max_length`` tokens) is one the harness refuses (an
AssertionError in its ``hf`` model) and x1 skips (counted as ``skipped``): such items are left out of the
harness's run (``simple_evaluate(samples=...)``), and the bench checks that x1 skipped exactly those.

Speed: the harness runs first, then x1, in the same run; both fp32 on the CPU, the same batch size and torch
threads, one warm-up batch each (the same requests), model loading excluded. "Scoring" is x1's ``score()``
over the items both score (tokenizing included; as shipped, an item's context shared by its endings, and
again with ``share_context=False``) against the harness's ``lm.loglikelihood`` call. "End to end" adds reading
the sets and building the requests (x1: ``evaluate_model`` over all the items; harness: ``simple_evaluate``
with the model already built). Prints items/s and the ratio x1 / harness (> 1: x1 is faster).

The harness lives in its own venv, ``bench/.venv-harness``, made on first use: ``python -m venv`` from this
interpreter, a ``.pth`` file that puts this venv's site-packages (torch, transformers, numpy, pyarrow) on its
path, then ``pip install`` of ``HARNESS_PINS`` under ``HARNESS_CONSTRAINTS`` (no torch is ever installed there;
the bench checks). ``--harness-worker SPEC`` is the mode that venv's Python runs this file in.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = REPO / "demo-run" / "checkpoints"
HARNESS_VENV = REPO / "bench" / ".venv-harness"
TASKS = ("hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande")
# the harness's own task definitions each x1 task reuses (paths inside lm_eval/tasks/)
HARNESS_YAML = {
    "hellaswag": "hellaswag/hellaswag.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "piqa": "piqa/piqa.yaml",
    "winogrande": "winogrande/default.yaml",
}

# What the harness venv installs. lm_eval's base requirements hold no torch/transformers; accelerate is what its
# `hf` model imports besides (its own requirement "torch>=2.6.0" is met by the torch on the path).
HARNESS_PINS = ("lm_eval==0.4.13", "accelerate==1.16.0")
# The rest of the resolution (2026-12-04), pinned so the venv is the same on every machine. Whatever the .pth
# path already provides (torch, transformers, numpy, pyarrow, huggingface_hub, jinja2, tqdm...) is taken from it.
HARNESS_CONSTRAINTS = (
    "absl-py==2.5.1",
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "chardet==6.0.0.post1",
    "colorama==0.4.6",
    "DataProperty==1.1.1",
    "datasets==5.2.0",
    "defusedxml==0.7.1",
    "dill==0.4.1",
    "evaluate==0.4.6",
    "frozenlist==1.8.0",
    "joblib==1.6.0",
    "lxml==6.2.0",
    "mbstrdecoder==1.1.5",
    "more-itertools==11.2.1",
    "multidict==7.2.1",
    "multiprocess==0.70.19",
    "narwhals==2.29.0",
    "nltk==3.10.4",
    "pandas==3.1.1",
    "pathvalidate==3.3.1",
    "portalocker==4.4.2",
    "propcache==0.5.4",
    "psutil==7.2.2",
    "pytablewriter==1.2.1",
    "python-dateutil==2.9.0.post0",
    "pytz==2026.6",
    "rouge_score==0.1.2",
    "sacrebleu==2.6.0",
    "scikit-learn==1.9.1",
    "scipy==1.17.1",
    "six==1.17.0",
    "sqlitedict==2.1.0",
    "tabledata==1.3.5",
    "tabulate==0.10.0",
    "tcolorpy==0.1.7",
    "threadpoolctl==3.8.0",
    "typepy==1.3.5",
    "word2number==1.1",
    "xxhash==4.1.0",
    "yarl==1.25.1",
)
# never to be installed into the harness venv: they must come from x1's venv through the .pth file
SHARED = ("torch", "transformers", "numpy", "pyarrow", "tokenizers", "safetensors")
OFFLINE = {
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}


# --------------------------------------------------------------------------------------------------------------
# the harness venv


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _site_packages(python: Path | str) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def ensure_harness_venv(venv: Path) -> Path:
    """The harness venv's python, made (or remade, when the pins changed) on first use."""
    import sysconfig

    ours = Path(sysconfig.get_paths()["purelib"])
    stamp_text = json.dumps(
        {
            "pins": HARNESS_PINS,
            "constraints": HARNESS_CONSTRAINTS,
            "shared": str(ours),
            "python": sys.version.split()[0],
        }
    )
    stamp = venv / ".x1-harness-installed"
    if stamp.is_file() and stamp.read_text() == stamp_text and _venv_python(venv).is_file():
        return _venv_python(venv)
    if venv.exists():
        print(f"[harness] {venv}: not made with these pins; making it again", file=sys.stderr)
        shutil.rmtree(venv)
    print(
        f"[harness] making {venv} (once): venv, .pth to {ours}, pip install {' '.join(HARNESS_PINS)}",
        file=sys.stderr,
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = _venv_python(venv)
    site = _site_packages(py)
    (site / "x1_shared_site_packages.pth").write_text(f"{ours}\n")
    with tempfile.TemporaryDirectory(prefix="x1-harness-pins-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(HARNESS_CONSTRAINTS + HARNESS_PINS) + "\n")
        pip = subprocess.run(
            [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-c", str(constraints), *HARNESS_PINS],
            capture_output=True,
            text=True,
        )
        if pip.returncode != 0:
            raise SystemExit(f"[harness] pip install failed (exit {pip.returncode}):\n{pip.stderr[-3000:]}")
    pulled = [name for name in SHARED if any(site.glob(f"{name}-*.dist-info")) or (site / name).exists()]
    if pulled:
        raise SystemExit(
            f"[harness] pip installed {', '.join(pulled)} into {venv}; they must come from {ours}. "
            f"Delete {venv} and check HARNESS_CONSTRAINTS"
        )
    check = subprocess.run(
        [str(py), "-c", "import torch, transformers, lm_eval; print(torch.__file__)"], capture_output=True, text=True
    )
    if check.returncode != 0 or not check.stdout.strip().startswith(str(ours)):
        raise SystemExit(f"[harness] {venv} does not import torch from {ours}: {check.stderr.strip()[-800:]}")
    stamp.write_text(stamp_text)
    return py


# --------------------------------------------------------------------------------------------------------------
# the harness side (runs in the harness venv: no x1 import here)


def harness_worker(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    import torch

    torch.set_num_threads(int(spec["threads"]))
    import lm_eval
    import transformers
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    originals = Path(lm_eval.__file__).parent / "tasks"
    include = Path(spec["include_dir"])
    include.mkdir(parents=True, exist_ok=True)
    for task, arrow in spec["arrows"].items():
        cfg: dict[str, Any] = {
            "include": str(originals / HARNESS_YAML[task]),
            "task": f"x1_{task}",
            "tag": [],
            "dataset_path": "arrow",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {"validation": arrow}},
            "training_split": None,
            "validation_split": "validation",
            "test_split": None,
        }
        (include / f"x1_{task}.yaml").write_text(json.dumps(cfg, indent=2) + "\n")  # JSON is YAML

    lm = get_model("hf").create_from_arg_string(
        f"pretrained={spec['hf_dir']},dtype=float32", {"batch_size": spec["batch_size"], "device": "cpu"}
    )
    plain = lm.loglikelihood
    calls: list[tuple[list[Any], float, float]] = []  # (requests, wall s, CPU s) of each call the evaluator makes

    def timed(requests: list[Any], *a: Any, **kw: Any) -> Any:
        w0, c0 = time.perf_counter(), time.process_time()
        out = plain(requests, *a, **kw)
        calls.append((requests, time.perf_counter() - w0, time.process_time() - c0))
        return out

    plain([Instance("loglikelihood", {}, (c, x), i) for i, (c, x) in enumerate(spec["warmup"])], disable_tqdm=True)
    # The harness refuses (AssertionError in HFLM._loglikelihood_tokens) a continuation longer than max_length
    # tokens; such items are left out of its run (simple_evaluate's `samples`) and reported.
    keep: dict[str, list[int]] = {}
    refused: dict[str, list[int]] = {}
    for task, docs in spec["requests"].items():
        for k, reqs in enumerate(docs):
            fits = all(len(lm._encode_pair(c, x)[1]) <= lm.max_length for c, x in reqs)
            (keep if fits else refused).setdefault(task, []).append(k)
    which = {"samples": {f"x1_{t}": keep.get(t, []) for t in spec["arrows"]}} if refused else {"limit": spec["limit"]}
    lm.loglikelihood = timed
    manager = TaskManager(include_path=str(include), include_defaults=False)
    w0, c0 = time.perf_counter(), time.process_time()
    res = lm_eval.simple_evaluate(
        model=lm, tasks=[f"x1_{t}" for t in spec["arrows"]], task_manager=manager, log_samples=True, **which
    )
    total_wall, total_cpu = time.perf_counter() - w0, time.process_time() - c0
    assert res is not None
    runs = [(sum(c[1] for c in calls), sum(c[2] for c in calls))]
    for _ in range(int(spec["repeats"]) - 1):  # the same requests again, as the evaluator passed them
        w0, c0 = time.perf_counter(), time.process_time()
        for reqs, _w, _c in calls:
            plain(reqs)
        runs.append((time.perf_counter() - w0, time.process_time() - c0))
    out: dict[str, Any] = {
        "tasks": {},
        "refused": refused,
        "versions": {
            "lm_eval": getattr(lm_eval, "__version__", "?"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "max_length": lm.max_length,
        },
    }
    for task in spec["arrows"]:
        r = res["results"][f"x1_{task}"]
        samples = sorted(res["samples"][f"x1_{task}"], key=lambda s: s["doc_id"])
        out["tasks"][task] = {
            "n": len(samples),
            "acc": r.get("acc,none"),
            "acc_norm": r.get("acc_norm,none"),
            "items": [
                {
                    "doc_id": s["doc_id"],
                    "target": s["target"],
                    "requests": [list(a) for a in s["arguments"]],
                    "lls": [float(fr[0]) for fr in s["filtered_resps"]],
                    "acc": s.get("acc"),
                    "acc_norm": s.get("acc_norm"),
                }
                for s in samples
            ],
        }
    out["timing"] = {
        "runs": runs,
        "requests": sum(len(c[0]) for c in calls),
        "calls": len(calls),
        "end_to_end_wall": total_wall,
        "end_to_end_cpu": total_cpu,
    }
    Path(spec["out"]).write_text(json.dumps(out))
    return 0


def run_harness(py: Path, spec: dict[str, Any], work: Path, timeout_s: float) -> dict[str, Any]:
    spec_path = work / "harness-spec.json"
    spec_path.write_text(json.dumps(spec))
    log = work / "harness.log"
    env = {**os.environ, **OFFLINE, "HF_DATASETS_CACHE": str(work / "hf-datasets"), "HF_HOME": str(work / "hf-home")}
    env.pop("PYTHONPATH", None)
    with open(log, "w") as f:
        proc = subprocess.run(
            [str(py), str(Path(__file__).resolve()), "--harness-worker", str(spec_path)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
            timeout=timeout_s,
        )
    if proc.returncode != 0 or not Path(spec["out"]).is_file():
        tail = log.read_text()[-4000:]
        raise SystemExit(f"[harness] the harness run failed (exit {proc.returncode}); its log ends:\n{tail}")
    return json.loads(Path(spec["out"]).read_text())


# --------------------------------------------------------------------------------------------------------------
# comparison


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


def _tie(values: list[float], a: int, b: int, tol: float) -> bool:
    return abs(values[a] - values[b]) <= tol


def _diff(vals: list[float], h_vals: list[float], gold: int, doc: int, tol: float) -> dict[str, Any]:
    a, b = _argmax(vals), _argmax(h_vals)
    return {
        "doc": doc,
        "x1_pick": a,
        "harness_pick": b,
        "gold": gold,
        "tie": _tie(vals, a, b, tol) or _tie(h_vals, a, b, tol),
        "x1_gap": abs(vals[a] - vals[b]),
        "harness_gap": abs(h_vals[a] - h_vals[b]),
    }


def compare_task(
    items: list[Any], x1_lls: list[float], h: dict[str, Any], tol: float, has_norm: bool
) -> dict[str, Any]:
    """Per-item checks of one task on the items both sides scored: the request strings, the gold index, the
    log-likelihoods, and every item that one side gets right and the other wrong."""
    by_doc = {hi["doc_id"]: hi for hi in h["items"]}
    out: dict[str, Any] = {
        "common": 0,
        "prompt_mismatch": [],
        "gold_mismatch": [],
        "max_abs_ll": 0.0,
        "max_abs_ll_doc": None,
        "acc_diff": [],
        "acc_norm_diff": [],
        "x1_all": {"acc": 0.0, "acc_norm": None},
        "x1_common": {"acc": None, "acc_norm": None},
        "x1_skipped": [],
        "skip_mismatch": [],
    }
    at = 0
    hits = hits_norm = common_hits = common_hits_norm = 0
    for k, it in enumerate(items):
        lls = x1_lls[at : at + it.n_choices]
        at += it.n_choices
        if not all(math.isfinite(v) for v in lls):  # x1 skips an item whose answer alone exceeds seq_len
            out["x1_skipped"].append(k)
            if k in by_doc:
                out["skip_mismatch"].append(k)  # ... which the harness scored: not the same items
            continue
        norm = [v / c for v, c in zip(lls, it.choice_chars, strict=True)]
        hit, hit_norm = _argmax(lls) == it.gold, _argmax(norm) == it.gold
        hits += hit
        hits_norm += hit_norm
        hi = by_doc.get(k)
        if hi is None:
            continue
        out["common"] += 1
        common_hits += hit
        common_hits_norm += hit_norm
        if [list(r) for r in it.requests] != hi["requests"]:
            out["prompt_mismatch"].append({"doc": k, "x1": [list(r) for r in it.requests], "harness": hi["requests"]})
            continue
        target = hi["target"]  # WinoGrande's is the shared continuation: its gold is checked through acc
        if (isinstance(target, int) or str(target).isdigit()) and int(target) != it.gold:
            out["gold_mismatch"].append({"doc": k, "x1": it.gold, "harness": target})
        worst = max(abs(x - y) for x, y in zip(lls, hi["lls"], strict=True))
        if worst > out["max_abs_ll"]:
            out["max_abs_ll"], out["max_abs_ll_doc"] = worst, k
        if bool(hi["acc"]) != hit:
            out["acc_diff"].append(_diff(lls, hi["lls"], it.gold, k, tol))
        if has_norm and bool(hi["acc_norm"]) != hit_norm:
            h_norm = [v / c for v, c in zip(hi["lls"], it.choice_chars, strict=True)]
            out["acc_norm_diff"].append(_diff(norm, h_norm, it.gold, k, tol))
    scored = len(items) - len(out["x1_skipped"])
    if scored:
        out["x1_all"] = {"acc": hits / scored, "acc_norm": hits_norm / scored if has_norm else None}
    if out["common"]:
        n = out["common"]
        out["x1_common"] = {"acc": common_hits / n, "acc_norm": common_hits_norm / n if has_norm else None}
    return out


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) < 1e-12


# --------------------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help=f"step dir, checkpoint dir or .safetensors (default: {DEFAULT_CHECKPOINT})",
    )
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: all five)")
    p.add_argument("--limit", type=int, default=200, help="first N items of each task (default 200)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per forward, both sides (default 32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads, both sides (default: torch's)")
    p.add_argument(
        "--repeats", type=int, default=3, help="scoring runs per side, the best and the median reported (default 3)"
    )
    p.add_argument(
        "--tie",
        type=float,
        default=1e-4,
        help="two choices within this (log-likelihood, or per character for acc_norm) are a float tie (default 1e-4)",
    )
    p.add_argument("--eval-data-dir", type=Path, help="<task>.arrow files (default: x1's cache)")
    p.add_argument("--harness-venv", type=Path, default=HARNESS_VENV)
    p.add_argument("--harness-timeout", type=float, default=3600.0, help="seconds (default 3600)")
    p.add_argument("--json", type=Path, help="write every figure and per-item difference here")
    p.add_argument("--harness-worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.harness_worker is not None:
        return harness_worker(args.harness_worker)

    ckpt = args.checkpoint
    if ckpt is None:
        if not DEFAULT_CHECKPOINT.exists():
            print(
                f"no checkpoint: {DEFAULT_CHECKPOINT} does not exist; run `make demo` first (or pass --checkpoint)",
                file=sys.stderr,
            )
            return 2
        ckpt = DEFAULT_CHECKPOINT
    elif not ckpt.exists():
        print(f"--checkpoint {ckpt}: does not exist", file=sys.stderr)
        return 2

    import torch

    from x1_pretrain.data.tokenizer import load_gpt2
    from x1_pretrain.evals import registry, sets
    from x1_pretrain.evals.run import evaluate_model, load_items
    from x1_pretrain.evals.score import Scorer, score
    from x1_pretrain.report.ckpt_source import load_model, resolve

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    names = registry.task_list(args.tasks)
    src = resolve(ckpt)
    arrows = {t: str(sets.locate(t, args.eval_data_dir)) for t in names}  # hash-checked; fetched on first use
    py = ensure_harness_venv(args.harness_venv)

    with tempfile.TemporaryDirectory(prefix="x1-bench-harness-") as tmp:
        work = Path(tmp)
        hf_dir = work / "hf"
        exp = subprocess.run(
            [sys.executable, "-m", "x1_pretrain.export_hf", "--checkpoint", str(src.weights), "--output", str(hf_dir)],
            capture_output=True,
            text=True,
        )
        if exp.returncode != 0:
            raise SystemExit(f"export_hf failed (exit {exp.returncode}): {exp.stderr.strip()[-2000:]}")

        items, _ = load_items(names, args.limit, args.eval_data_dir)
        warmup = [r for it in items[names[0]] for r in it.requests][: args.batch_size]

        # the harness first: it says which items it cannot score
        load0 = os.getloadavg()[0]
        spec = {
            "hf_dir": str(hf_dir),
            "arrows": arrows,
            "limit": args.limit,
            "batch_size": args.batch_size,
            "threads": threads,
            "repeats": args.repeats,
            "include_dir": str(work / "tasks"),
            "out": str(work / "harness.json"),
            "warmup": [list(r) for r in warmup],
            "requests": {t: [[list(r) for r in it.requests] for it in its] for t, its in items.items()},
        }
        h = run_harness(py, spec, work, args.harness_timeout)

    # x1: the model loaded as evaluate.py loads it, one warm-up batch, then evaluate_model timed (all items)
    model = load_model(src, "cpu")
    encode = load_gpt2(None).encode
    Scorer(model, encode, args.batch_size).logliks(warmup)
    w0, c0 = time.perf_counter(), time.process_time()
    scores, _ = evaluate_model(model, encode, names, args.limit, args.batch_size, False, args.eval_data_dir)
    x1_e2e_wall, x1_e2e_cpu = time.perf_counter() - w0, time.process_time() - c0
    # scoring speed, on the items both sides score: score() per task as shipped (an item's context shared by its
    # endings), then with one row per request (share_context=False) to show what the sharing buys
    refused = {t: set(h["refused"].get(t, [])) for t in names}
    both = {t: [it for k, it in enumerate(items[t]) if k not in refused[t]] for t in names}

    def scoring(**kw: Any) -> tuple[list[Any], list[tuple[float, float]]]:
        runs, out = [], []
        for _ in range(args.repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            out = [score(t, both[t], Scorer(model, encode, args.batch_size, **kw)) for t in names]
            runs.append((time.perf_counter() - w0, time.process_time() - c0))
        return out, runs

    common, x1_runs = scoring()
    plain_runs: list[tuple[float, float]] | None = None
    with contextlib.suppress(TypeError):  # a Scorer without the switch
        plain_runs = scoring(share_context=False)[1]
    # x1's per-request log-likelihoods, for the per-item comparison (not timed)
    x1_lls: dict[str, list[float]] = {}
    for t in names:
        got = Scorer(model, encode, args.batch_size).logliks([r for it in items[t] for r in it.requests])
        x1_lls[t] = list(got[0] if isinstance(got, tuple) else got)

    # ---- scores
    ok = True
    rows, details = [], {}
    for sc, cs in zip(scores, common, strict=True):
        t = sc.task
        ht = h["tasks"][t]
        d = compare_task(items[t], x1_lls[t], ht, args.tie, "acc_norm" in registry.TASKS[t].metrics)
        d["refused"] = h["refused"].get(t, [])
        details[t] = d
        # the per-request pass must reproduce score()'s own figures, else the per-item checks say nothing
        consistent = (
            _close(d["x1_all"]["acc"], sc.acc)
            and _close(d["x1_all"]["acc_norm"], sc.acc_norm)
            and _close(d["x1_common"]["acc"], cs.acc)
            and _close(d["x1_common"]["acc_norm"], cs.acc_norm)
        )
        x1 = {"acc": cs.acc, "acc_norm": cs.acc_norm}
        equal = _close(x1["acc"], ht["acc"]) and _close(x1["acc_norm"], ht["acc_norm"])
        diffs = d["acc_diff"] + d["acc_norm_diff"]
        real = [x for x in diffs if not x["tie"]]
        bad = bool(
            d["common"] != ht["n"]
            or d["prompt_mismatch"]
            or d["gold_mismatch"]
            or real
            or d["skip_mismatch"]
            or d["x1_skipped"] != d["refused"]
            or not consistent
            or (not equal and not diffs)
        )
        ok = ok and not bad
        verdict = "equal" if equal and not diffs else "DIFFERENT" if bad else f"equal but {len(diffs)} float tie(s)"
        if d["prompt_mismatch"]:
            verdict += f"; {len(d['prompt_mismatch'])} prompts differ"
        if not consistent:
            verdict += "; x1's logliks do not reproduce its score()"
        rows.append(
            {
                "task": t,
                "n_x1": cs.n,
                "n_h": ht["n"],
                "acc_x1": x1["acc"],
                "acc_h": ht["acc"],
                "norm_x1": x1["acc_norm"],
                "norm_h": ht["acc_norm"],
                "max_abs_ll": d["max_abs_ll"],
                "verdict": verdict,
                "truncated": cs.truncated,
                "n_all": sc.n,
                "x1_all": {"acc": sc.acc, "acc_norm": sc.acc_norm},
            }
        )

    def f4(v: float | None) -> str:
        return "—" if v is None else f"{v:.4f}"

    hv = h["versions"]
    print(f"checkpoint: {src.describe()}")
    print(f"items: the first {args.limit} of each task; batch {args.batch_size}; torch threads {threads}; fp32, CPU")
    print(
        f"harness: lm_eval {hv['lm_eval']}, transformers {hv['transformers']}, torch {hv['torch']} "
        f"({hv['torch_threads']} threads), max_length {hv['max_length']}; x1: torch {torch.__version__}"
    )
    print()
    print(
        f"{'task':<14} {'n x1':>5} {'n h':>5} {'acc x1':>8} {'acc h':>8} {'norm x1':>8} {'norm h':>8} "
        f"{'max|Δll|':>9}  verdict"
    )
    for r in rows:
        print(
            f"{r['task']:<14} {r['n_x1']:>5} {r['n_h']:>5} {f4(r['acc_x1']):>8} {f4(r['acc_h']):>8} "
            f"{f4(r['norm_x1']):>8} {f4(r['norm_h']):>8} {r['max_abs_ll']:>9.2e}  {r['verdict']}"
            + (f" ({r['truncated']} x1 requests cut from the left)" if r["truncated"] else "")
        )
    for r in rows:
        d = details[r["task"]]
        if d["refused"]:
            print(
                f"  {r['task']}: the harness refuses {len(d['refused'])} of the {len(items[r['task']])} items (a "
                f"continuation longer than its max_length, {hv['max_length']} tokens: AssertionError), docs "
                f"{d['refused'][:12]}{' ...' if len(d['refused']) > 12 else ''}; x1 skips "
                f"{'the same items' if d['x1_skipped'] == d['refused'] else 'OTHER items: ' + str(d['x1_skipped'])}"
                f" (its score() over the {r['n_all']} it scores: acc {f4(r['x1_all']['acc'])}, "
                f"acc_norm {f4(r['x1_all']['acc_norm'])})"
            )
        for kind in ("acc_diff", "acc_norm_diff"):
            for x in d[kind]:
                print(
                    f"  {r['task']} doc {x['doc']}: {kind[:-5]} x1 picks {x['x1_pick']}, harness {x['harness_pick']}"
                    f" (gold {x['gold']}); gap x1 {x['x1_gap']:.2e}, harness {x['harness_gap']:.2e}: "
                    + ("float tie" if x["tie"] else "NOT a tie")
                )
        for x in d["prompt_mismatch"][:3]:
            print(f"  {r['task']} doc {x['doc']}: x1 {x['x1'][0]!r}\n      harness {x['harness'][0]!r}")
        for x in d["gold_mismatch"][:3]:
            print(f"  {r['task']} doc {x['doc']}: gold x1 {x['x1']}, harness {x['harness']}")

    # ---- speed
    n_all = sum(s.n for s in scores)
    n_items = sum(s.n for s in common)
    h_items = sum(h["tasks"][s.task]["n"] for s in common)
    n_req = sum(len(it.requests) for t in names for it in both[t])
    tm = h["timing"]
    h_best, h_med = min(r[0] for r in tm["runs"]), statistics.median(r[0] for r in tm["runs"])
    print()
    print(
        f"scoring, model loaded and warm, {args.repeats} run(s) each: best (median) wall s, CPU s of the best, "
        "items/s of the best, ratio to the harness's items/s (best; median)"
    )
    print(f"{'':<38} {'items':>6} {'requests':>9} {'wall s':>15} {'CPU s':>7} {'items/s':>8} {'x1/harness':>13}")
    speed = [("x1 score(), contexts shared (shipped)", n_items, n_req, x1_runs)]
    if plain_runs is not None:
        speed.append(("x1 score(), one row per request", n_items, n_req, plain_runs))
    speed.append(("harness lm.loglikelihood", h_items, tm["requests"], [tuple(r) for r in tm["runs"]]))
    figures = {}
    for name, n, req, runs in speed:
        best = min(runs, key=lambda r: r[0])
        med = statistics.median(r[0] for r in runs)
        ratio = (n / best[0]) / (h_items / h_best)
        ratio_med = (n / med) / (h_items / h_med)
        figures[name] = {
            "items": n,
            "requests": req,
            "runs": runs,
            "best_s": best[0],
            "median_s": med,
            "items_per_s": n / best[0],
            "ratio": ratio,
            "ratio_median": ratio_med,
        }
        print(
            f"{name:<38} {n:>6} {req:>9} {f'{best[0]:.2f} ({med:.2f})':>15} {best[1]:>7.2f} {n / best[0]:>8.1f} "
            f"{f'{ratio:.2f}; {ratio_med:.2f}':>13}"
        )
    x1_e2e_ips, h_e2e_ips = n_all / x1_e2e_wall, h_items / tm["end_to_end_wall"]
    print(
        f"end to end, once (sets read, requests built, scored; model load excluded): x1 evaluate_model {n_all} "
        f"items in {x1_e2e_wall:.2f} s = {x1_e2e_ips:.1f} items/s (CPU {x1_e2e_cpu:.2f} s); harness "
        f"simple_evaluate {h_items} in {tm['end_to_end_wall']:.2f} s = {h_e2e_ips:.1f} items/s (CPU "
        f"{tm['end_to_end_cpu']:.2f} s); ratio {x1_e2e_ips / h_e2e_ips:.2f}"
    )
    print(f"1-min load average {load0:.2f} before the harness, {os.getloadavg()[0]:.2f} at the end")
    print("scores: " + ("x1 = harness on every task (float ties aside)" if ok else "DIFFERENT (see above)"))

    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "details": details,
                    "harness_timing": tm,
                    "harness_versions": h["versions"],
                    "speed": figures,
                    "x1_end_to_end": {"items": n_all, "wall_s": x1_e2e_wall, "cpu_s": x1_e2e_cpu},
                    "items": n_items,
                    "requests": n_req,
                    "threads": threads,
                    "limit": args.limit,
                    "batch_size": args.batch_size,
                    "checkpoint": str(src.weights),
                    "arrow_sha256": {t: hashlib.sha256(Path(a).read_bytes()).hexdigest() for t, a in arrows.items()},
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
