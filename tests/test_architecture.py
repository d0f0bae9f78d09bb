"""The layout's rules (docs/architecture.md), held by parsing the package's imports and functions."""

from __future__ import annotations

import ast
import collections
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from .conftest import REPO

PKG = REPO / "src" / "x1_pretrain"
SUBPACKAGES = ("core", "data", "model", "evals", "budget", "ckpt", "trainer", "supervise", "launch", "report")
ENTRY_POINTS = (
    "tokenize_data",
    "train",
    "export_run",
    "budget_sidecar",
    "budget_serve",
    "watchdog",
    "plan",
    "dod",
    "postmortem",
    "export_hf",
    "sample",
    "alerts",
    "demo",
    "tokenizer",
    "evaluate",
    "remote",
)
COMMAND_PACKAGES = ("demo",)  # a command with more than one module: a package with a __main__
# Which subpackage may import which (besides itself and the standard library).
MAY_IMPORT = {
    "core": set(),
    "data": {"core"},
    "model": {"core"},
    "evals": {"core", "data"},
    "budget": {"core", "model"},
    "ckpt": {"core", "budget"},
    "trainer": {"core", "data", "model", "evals", "budget", "ckpt"},
    "supervise": {"core", "budget", "ckpt"},  # never the trainer it guards (nor torch: see below)
    "launch": {"core", "data", "model", "evals", "budget", "ckpt", "trainer", "supervise"},
    "report": {"core", "data", "model", "evals", "budget", "ckpt", "trainer"},
    "demo": set(SUBPACKAGES) - {"demo"},
}
# report reads the trainer's on-disk formats only, never its machinery
REPORT_MAY_READ = {"ckpt.checkpoint", "trainer.spike"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    return ".".join(rel.parts)


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(internal modules as 'sub.module' or 'sub', external top-level packages) imported anywhere in the file."""
    here = _module_name(path).split(".")
    internal, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                target = [*base, *(node.module.split(".") if node.module else [])]
                if node.module and len(target) == 1 and target[0] in SUBPACKAGES:  # from ..ckpt import checkpoint
                    internal.update(f"{target[0]}.{a.name}" for a in node.names)
                elif node.module:
                    internal.add(".".join(target))
                else:
                    internal.update(".".join([*target, a.name]) for a in node.names)
            elif node.module and node.module.startswith("x1_pretrain"):
                internal.add(node.module.removeprefix("x1_pretrain").lstrip("."))
            elif node.module:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            external.update(a.name.split(".")[0] for a in node.names)
    return {m for m in internal if m and m != "__version__"}, external


FILES = sorted(PKG.rglob("*.py"))
MODULES = {_module_name(p): imports(p) for p in FILES}


def test_the_top_level_holds_only_entry_points():
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem != "__init__")
    assert top == sorted(set(ENTRY_POINTS) - set(COMMAND_PACKAGES))
    dirs = sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert dirs == sorted(SUBPACKAGES + COMMAND_PACKAGES)
    for name in COMMAND_PACKAGES:
        assert (PKG / name / "__main__.py").is_file()


@pytest.mark.parametrize("sub", SUBPACKAGES + COMMAND_PACKAGES)
def test_each_subpackage_imports_only_what_it_may(sub):
    allowed = MAY_IMPORT[sub] | {sub}
    for name, (internal, _) in MODULES.items():
        if name.split(".")[0] != sub:
            continue
        for target in internal:
            top = target.split(".")[0]
            assert top in allowed, f"{name} imports {target}: {sub} may import only {sorted(allowed)}"
            if sub == "report" and top in ("ckpt", "trainer"):
                assert target in REPORT_MAY_READ, f"{name} imports {target}: report reads on-disk formats only"


def test_subpackages_never_import_the_entry_points():
    for name, (internal, _) in MODULES.items():
        top = name.split(".")[0]
        if "." in name and top not in COMMAND_PACKAGES:
            assert not {t for t in internal if t.split(".")[0] in ENTRY_POINTS}, name


def test_only_tracking_and_runs_touch_mlflow():
    users = sorted(m for m, (_, ext) in MODULES.items() if "mlflow" in ext)
    assert users == ["report.runs", "trainer.tracking"]


def test_data_and_model_never_import_each_other():
    for name, (internal, _) in MODULES.items():
        top = name.split(".")[0]
        other = {"data": "model", "model": "data"}.get(top)
        if other:
            assert not any(t.split(".")[0] == other for t in internal), name


def test_the_budget_decision_is_pure():
    """The guard and the money arithmetic every dollar figure comes from: the standard library only."""
    internal, external = MODULES["budget.guard"]
    assert internal <= {"core.errors", "core.defaults", "budget.money"}
    money_internal, money_external = MODULES["budget.money"]
    assert money_internal <= {"core.defaults"} and not MODULES["core.defaults"][0] and not MODULES["core.defaults"][1]
    for ext in (external, money_external):
        assert ext <= {"__future__", "dataclasses", "datetime", "enum", "math", "typing"}, ext


def test_the_dod_checker_reads_only_files():
    internal, external = MODULES["report.dod"]
    assert not {
        t for t in internal if t.split(".")[0] in ("ckpt", "trainer", "launch", "supervise") and t != "ckpt.checkpoint"
    }
    assert "report.runs" not in internal and "mlflow" not in external


def test_importing_any_module_does_nothing(tmp_path):
    names = sorted("x1_pretrain" + ("." + m if m != "__init__" else "") for m in MODULES)
    code = f"import importlib\nfor n in {names!r}:\n    importlib.import_module(n.replace('.__init__', ''))\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and list(Path(tmp_path).iterdir()) == []


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_points_are_thin_and_guarded(name):
    path = PKG / name / "__main__.py" if name in COMMAND_PACKAGES else PKG / f"{name}.py"
    text = path.read_text()
    lines = sum(statement_lines(text).values())
    assert lines < 100, f"{name}.py has {lines} statements; move the work into a subpackage"
    assert "def main(argv: list[str] | None = None) -> int:" in text
    assert text.rstrip().endswith('if __name__ == "__main__":\n    raise SystemExit(main())')


def test_every_entry_point_answers_help(tmp_path):
    code = (
        "import contextlib, io, importlib, sys\nfor n in sys.argv[1:]:\n"
        "    out = io.StringIO()\n"
        "    try:\n        with contextlib.redirect_stdout(out):\n"
        "            code = importlib.import_module('x1_pretrain.' + n).main(['--help'])\n"
        "    except SystemExit as e:\n        code = e.code\n"
        "    assert code == 0, (n, code)\n"
        "    assert '--' in out.getvalue() and 'usage' in out.getvalue(), n\n"
        "    assert '--log-level {debug,info,warning,error}' in out.getvalue(), n  # every command has it\n"
    )
    names = [f"{n}.__main__" if n in COMMAND_PACKAGES else n for n in ENTRY_POINTS]
    r = subprocess.run([sys.executable, "-c", code, *names], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def statement_lines(text: str) -> collections.Counter[int]:
    """The logical lines of ``text`` (a statement, whatever the formatter's line breaks), keyed by the line they
    end on: sizes measured in them do not change when ``ruff format`` splits a call over several lines."""
    return collections.Counter(
        t.end[0] for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.NEWLINE
    )


def _functions():
    for path in FILES:
        text = path.read_text()
        ends = statement_lines(text)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                if names and names[0] in ("self", "cls"):
                    names = names[1:]
                size = sum(n for line, n in ends.items() if node.lineno <= line <= node.end_lineno)
                yield f"{_module_name(path)}.{node.name}", size, len(names)


def test_functions_are_short_and_take_few_parameters():
    long = [(n, lines) for n, lines, _ in _functions() if lines > 70]
    wide = [(n, params) for n, _, params in _functions() if params > 7]
    assert not long, f"functions over 70 statements: {long}"
    assert not wide, f"functions with more than 7 parameters (group them in a dataclass): {wide}"


def test_tests_mirror_the_layout():
    tests = REPO / "tests"
    for sub in SUBPACKAGES:
        assert (tests / sub / "__init__.py").is_file(), f"tests/{sub}/ mirrors src/x1_pretrain/{sub}/"
    for path in tests.glob("*/test_*.py"):
        assert path.parent.name in SUBPACKAGES, path


def test_nothing_but_source_under_src():
    """Every tracked file under src/ is Python source or the py.typed marker (a stray wheel or data file would
    ship inside the package)."""
    tracked = subprocess.run(["git", "ls-files", "src"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    if not tracked.strip():
        pytest.skip("not a git checkout")
    other = [f for f in tracked.split() if not (f.endswith(".py") or f.endswith("/py.typed"))]
    assert not other, f"not source: {other}"


def test_small_shared_pieces_exist_once():
    """The process-alive check, the folder renamed into place and the default MLflow store are written once."""
    text = {p: p.read_text() for p in FILES}
    assert [p.name for p, t in text.items() if re.search(r"os\.kill\([^,]+, 0\)", t)] == ["fileio.py"]
    assert [p.name for p, t in text.items() if "mlflow.db" in t.replace("<ckpt-dir>/mlflow.db", "")] == ["names.py"]
    renames = [p.name for p, t in text.items() if ".old-{os.getpid()}" in t]
    assert renames == ["fileio.py"], renames


def test_metric_names_are_constants_and_every_name_read_is_written():
    """Metric names live in core/names.py only; a name the report reads must be one the trainer writes (a typo
    would otherwise give an empty series and no error)."""
    from x1_pretrain.core import names

    literal = re.compile(r"""["'](?:train|val|budget|checkpoint|spike|run)/[a-z0-9_]+["']""")
    bare = [
        f"{p.relative_to(PKG)}: {m.group(0)}"
        for p in FILES
        if p.name != "names.py"
        for m in literal.finditer(p.read_text())
    ]
    assert not bare, f"use the constants of core/names.py: {bare}"
    used = {
        p: {r for r in re.findall(r"\bN\.([A-Z][A-Z0-9_]+)\b", p.read_text()) if "TAG_" not in r}
        | ({"EVAL_TASK_PREFIX"} if "N.eval_task_metric(" in p.read_text() else set())  # eval/<task>/<m>
        for p in FILES
    }
    for p, refs in used.items():
        unknown = [r for r in refs if not hasattr(names, r)]
        assert not unknown, f"{p.name}: {unknown}"
    written = set().union(*(r for p, r in used.items() if p.parent.name in ("trainer", "launch", "ckpt", "budget")))
    read = set().union(*(r for p, r in used.items() if p.parent.name == "report"))
    assert read <= written, f"read but never written: {sorted(read - written)}"
    constants = {k for k, v in vars(names).items() if isinstance(v, str) and v in names.METRICS}
    assert constants <= written, f"defined but never written: {sorted(constants - written)}"


def test_tag_names_are_constants_and_every_tag_read_is_written():
    """MLflow tags as the metrics: the names live in core/names.py, a tag the report reads is one the trainer
    sets, and no tag is read or set through a bare string."""
    from x1_pretrain.core import names

    bare = re.compile(r"""(?:tags\.get\(|tags\[|set_tags\(\{)\s*["'][a-z_0-9]+["']""")
    found = [f"{p.relative_to(PKG)}: {m.group(0)}" for p in FILES for m in bare.finditer(p.read_text())]
    assert not found, f"use the TAG_ constants of core/names.py: {found}"
    used = {p: set(re.findall(r"\bN\.(TAG_[A-Z0-9_]+)\b", p.read_text())) for p in FILES}
    written = set().union(*(r for p, r in used.items() if p.parent.name in ("trainer", "launch", "ckpt", "budget")))
    read = set().union(*(r for p, r in used.items() if p.parent.name == "report"))
    assert read <= written, f"read but never written: {sorted(read - written)}"
    constants = {k for k, v in vars(names).items() if k.startswith("TAG_")}
    assert constants == {k for k, v in vars(names).items() if isinstance(v, str) and v in names.TAGS}
    assert constants <= written, f"defined but never written: {sorted(constants - written)}"


HEAVY = ("torch", "numpy", "mlflow", "boto3", "safetensors", "transformers")


def _loaded_at_import(path: Path) -> tuple[set[str], set[str]]:
    """(internal modules, external top-level packages) that importing ``path`` runs: its module-level imports,
    those under a top-level if/try included, not the ones a function makes when it is called."""
    tree = ast.parse(path.read_text())
    body = list(tree.body)
    top: list[ast.stmt] = []
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            body[:0] = node.orelse  # what only a type checker reads
        elif isinstance(node, (ast.If, ast.Try)):
            body[:0] = [
                *node.body,
                *getattr(node, "orelse", []),
                *getattr(node, "finalbody", []),
                *(s for h in getattr(node, "handlers", []) for s in h.body),
            ]
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and node.module == "__future__"
        ):
            top.append(node)
    module = ast.Module(body=top, type_ignores=[])
    return imports_of_tree(module, path)


def imports_of_tree(tree: ast.Module, path: Path) -> tuple[set[str], set[str]]:
    here = _module_name(path).split(".")
    internal, external = set(), set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = [*here[: len(here) - node.level], *(node.module.split(".") if node.module else [])]
            internal.update(".".join([*base, a.name]) for a in node.names)  # a name or a module: both tried
            internal.add(".".join(base))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("x1_pretrain"):
                mod = node.module.removeprefix("x1_pretrain").lstrip(".")
                internal.update({mod, *(f"{mod}.{a.name}".lstrip(".") for a in node.names)})
            else:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("x1_pretrain."):
                    internal.add(a.name.removeprefix("x1_pretrain."))
                else:
                    external.add(a.name.split(".")[0])
    return internal, external


def _path_of(module: str) -> Path | None:
    for p in (PKG / f"{module.replace('.', '/')}.py", PKG / module.replace(".", "/") / "__init__.py"):
        if p.is_file():
            return p
    return None


def import_closure(entry: str) -> dict[str, set[str]]:
    """Every x1_pretrain module that importing ``entry`` loads (its packages' __init__ too), with the external
    packages each brings in."""
    seen: dict[str, set[str]] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b runs a/__init__ first
            mod = ".".join(parts[:i])
            path = _path_of(mod)
            if path is None or mod in seen:
                continue
            internal, external = _loaded_at_import(path)
            seen[mod] = external
            todo.extend(m for m in internal if m)
    return seen


def test_the_watchdog_never_loads_torch_nor_anything_that_does():
    """The supervisor of a crashing trainer must not load the library it guards against: nothing the watchdog
    imports at start (followed through every x1 module, packages' __init__ included) imports a heavy package."""
    heavy = {m: sorted(ext & set(HEAVY)) for m, ext in import_closure("watchdog").items() if ext & set(HEAVY)}
    assert heavy == {}, f"the watchdog's imports reach {heavy}: import these inside the function that needs them"
    # the check can fail: the trainer's closure does reach torch
    assert any("torch" in ext for ext in import_closure("train").values())


def test_no_package_over_3000_lines_and_no_module_over_600():
    sizes = {p: len(p.read_text().splitlines()) for p in FILES}
    big = {_module_name(p): n for p, n in sizes.items() if n > 600}
    assert not big, f"modules over 600 lines (split them by concern): {big}"
    per_package = collections.Counter()
    for p, n in sizes.items():
        per_package[_module_name(p).split(".")[0]] += n
    heavy = {k: n for k, n in per_package.items() if k in SUBPACKAGES and n > 3000}
    assert not heavy, f"packages over 3,000 lines: {heavy}"


def test_the_watchdog_trainer_contract_is_spelled_in_one_module():
    """The environment variables and file names the watchdog and the trainer share are constants of
    core/contract.py: no other module writes them as a string, so neither side can drift from the other."""
    from x1_pretrain.core import contract

    shared = {
        v for k, v in vars(contract).items() if isinstance(v, str) and (k.endswith("_ENV") or v.endswith(".json"))
    }
    assert {"X1_WATCHDOG_PID", "X1_EXIT_STATUS", "progress.json", "exit_status.json"} <= shared
    spelled = sorted(
        f"{_module_name(p)}: {node.value}"
        for p in FILES
        if p != PKG / "core" / "contract.py"
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Constant) and node.value in shared
    )
    assert not spelled, f"use the constants of core/contract.py: {spelled}"
