"""deploy/: the SkyPilot task (schema, SkyPilot's own loader when available, and its run script executed
with fake programs), the Dockerfile and the install script."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from x1_pretrain import tokenize_data, train
from x1_pretrain.ckpt.objstore import RemoteURL, Store

from .servers import wait_until

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
IMAGE = "nvcr.io/nvidia/pytorch:24.10-py3"
SEP = "\x1f"


@pytest.fixture(scope="module")
def task() -> dict:
    return yaml.safe_load((DEPLOY / "skypilot.yaml").read_text())


def _flat(script: str) -> str:
    """The script with line continuations joined and runs of blanks squeezed."""
    return re.sub(r"[ \t]+", " ", script.replace("\\\n", " "))


def test_resources_are_the_labs(task):
    r = task["resources"]
    assert r["accelerators"] == "A100-80GB:1"
    assert r["image_id"] == f"docker:{IMAGE}"
    assert r["disk_size"] >= 500 and r["cpus"] == "16+" and r["memory"] == "64+"
    assert r["use_spot"] is True
    spot = {c["infra"]: c["use_spot"] for c in r["ordered"]}
    assert spot == {"lambda": False, "runpod": True}  # Lambda sells no spot; RunPod does
    assert [c["infra"] for c in r["ordered"]] == ["lambda", "runpod"]  # the lab's primary, then the fallback


def test_job_recovery_recovers_preemption_not_decisions(task):
    rec = task["resources"]["job_recovery"]
    assert rec["strategy"] == "FAILOVER" and rec["max_restarts_on_errors"] == 0
    assert rec["recover_on_exit_codes"] == [75, 7, 8]  # 8: the store was down through the wait
    assert not {0, 2, 3, 4, 5, 6} & set(rec["recover_on_exit_codes"])


def test_scripts_parse_and_use_the_labs_commands(task):
    for key in ("setup", "run"):
        subprocess.run(["bash", "-n"], input=task[key], text=True, check=True)
    setup, run = _flat(task["setup"]), _flat(task["run"])
    assert "bash deploy/install.sh" in setup and "python -m x1_pretrain.tokenizer fetch" in setup
    assert "mkdir -p /workspace/{data,checkpoints,mlruns,logs}" in run
    assert (
        'huggingface-cli download HuggingFaceFW/fineweb-edu --repo-type dataset --include "sample/10BT/*.parquet" '
        "--local-dir /workspace/data/fineweb-edu"
    ) in run
    assert (
        'huggingface-cli download monology/pile-uncopyrighted --repo-type dataset --include "test/*.jsonl.zst"'
    ) in run
    assert ("--output-dir /workspace/data/tokenized --tokenizer gpt2 --val-fraction 0.001 --workers 16") in run
    assert (
        'python -m x1_pretrain.budget_sidecar --provider "$provider" --out /workspace/budget.json '
        "--interval-min 5" in run
    )
    # one machine runs the lab's command as written; several put torchrun before its module (launcher)
    assert "launcher=(python -m x1_pretrain.train)" in run and "budget_uri=/workspace/budget.json" in run
    assert (
        'python -m x1_pretrain.watchdog --events-file "$logs/watchdog.jsonl" -- "${launcher[@]}" '
        "--config configs/x1-50m-a100.yaml --data-dir /workspace/data/tokenized --ckpt-dir /workspace/checkpoints "
        '--mlflow-uri file:///workspace/mlruns --total-steps "$X1_TOTAL_STEPS" --ckpt-every 1800 '
        "--checkpoint-every-min 15 --eval-every 1800 --log-every 10 --resume-from-latest --budget-cap-usd 35.0 "
        '--budget-curr-cost-uri "$budget_uri"'
    ) in run
    assert (
        "python -m x1_pretrain.export_run --mlflow-uri file:///workspace/mlruns "
        "--output experiments/X1-pretraining/run-cloud/" in run
    )
    assert (
        "python -m x1_pretrain.postmortem --mlflow-uri file:///workspace/mlruns "
        "--output experiments/X1-pretraining/run-cloud/spike-postmortem.md" in run
    )
    assert "python -m x1_pretrain.dod --run-dir experiments/X1-pretraining/run-cloud/" in run
    # several nodes: budget.json is served to the cluster's bearer token only, on the head's private address
    assert "http.server" not in run
    assert (
        'python -m x1_pretrain.budget_serve --file /workspace/budget.json --bind "$head_ip" --port "$X1_BUDGET_PORT"'
    ) in run


def test_budget_stops_leave_with_exit_0(task):
    case = task["run"][task["run"].index('case "$code" in') :]
    assert re.search(r"3\|4\)(?:(?!;;).)*exit 0 ;;", case, re.S), "exit codes 3/4 must end the job with exit 0"


def test_a_store_down_through_every_wait_is_recovered_on_a_new_vm(task):
    """Exit 8 (the checkpoint store could not be reached at start): the watchdog retried it on this VM; the run
    script passes it on and SkyPilot starts a new VM for it, like every relaunched code but a crash (1)."""
    from x1_pretrain.core.contract import EXIT_CODES, EXIT_STORE_UNAVAILABLE, EXIT_UNEXPECTED

    recovered = set(task["resources"]["job_recovery"]["recover_on_exit_codes"])
    assert {e.code for e in EXIT_CODES if e.relaunched} - {EXIT_UNEXPECTED} == recovered
    case = task["run"][task["run"].index('case "$code" in') :]
    assert re.search(rf"\n\s*{EXIT_STORE_UNAVAILABLE}\)(?:(?!;;).)*exit {EXIT_STORE_UNAVAILABLE} ;;", case, re.S)


# --- the run script, executed with fake programs -------------------------------------------------------
FAKE_PYTHON = r"""#!/usr/bin/env bash
# one write per call (O_APPEND): the sidecar and the budget server start at once, two writes each would interleave
line="$(printf '%s\x1f' "$@")"; printf '%s\n' "$line" >> "$FAKE_DIR/calls"
case "$*" in
  "-m x1_pretrain.budget_sidecar"*)
    prev=""; for a in "$@"; do [ "$prev" = --out ] && out="$a"; prev="$a"; done
    echo $$ > "$FAKE_DIR/sidecar.pid"; echo '{"spent_usd": 0.1}' > "$out"; exec sleep 60 ;;
  "-m x1_pretrain.tokenize_data"*)
    prev=""; for a in "$@"; do [ "$prev" = --output-dir ] && out="$a"; prev="$a"; done
    mkdir -p "$out"; echo '{}' > "$out/meta.json"; exit 0 ;;
  "-m x1_pretrain.watchdog"*)
    printf '%s' "${X1_BUDGET_TOKEN:-}" > "$FAKE_DIR/budget_token"   # what the trainer would send for budget.json
    mkdir -p "$FAKE_WS/checkpoints/step_0000001"; touch "$FAKE_WS/checkpoints/step_0000001/DONE"
    echo step_0000001 > "$FAKE_WS/checkpoints/latest"; echo "trainer says hello"
    if [ -n "${FAKE_TRAIN_UNTIL_TERM:-}" ]; then  # a trainer that runs until a stop, then checkpoints and says so
      # (its sleep is killed too: a child left behind would hold the script's stdout open)
      sleep 600 & nap=$!
      trap 'kill $nap; echo "trainer stopped by TERM"; exit 75' TERM; touch "$FAKE_DIR/training"; wait; fi
    exit "$FAKE_TRAIN_EXIT" ;;
  "-m x1_pretrain.remote"*|"-m x1_pretrain.budget_serve"*) exec "$REAL_PYTHON" "$@" ;;
  "-m x1_pretrain."*) exit 0 ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""
FAKE_HF_CLI = r"""#!/usr/bin/env bash
line="$(printf '%s\x1f' huggingface-cli "$@")"; printf '%s\n' "$line" >> "$FAKE_DIR/calls"
case "$*" in *fineweb-edu*) [ -n "${FAKE_HF_FAIL:-}" ] && exit 1 ;; esac
prev=""; for a in "$@"; do [ "$prev" = --local-dir ] && dir="$a"; prev="$a"; done
mkdir -p "$dir/sample/10BT" "$dir/test"; touch "$dir/sample/10BT/000_00000.parquet" "$dir/test/a.jsonl.zst"
"""


def _run(
    task: dict, tmp: Path, train_exit: int, cloud: str = "Lambda", tokenized: bool = True, **env_overrides: str
) -> tuple[subprocess.CompletedProcess[str], list[list[str]], Path]:
    cmd, env, ws = _script(task, tmp, train_exit, cloud, tokenized, **env_overrides)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    return proc, _calls(tmp / "fake"), ws


def _calls(fake: Path) -> list[list[str]]:
    return [line.split(SEP)[:-1] for line in (fake / "calls").read_text().splitlines() if line]


def _script(
    task: dict, tmp: Path, train_exit: int, cloud: str = "Lambda", tokenized: bool = True, **env_overrides: str
) -> tuple[list[str], dict[str, str], Path]:
    ws, fake = tmp / "workspace", tmp / "fake"
    for d in (ws, fake / "bin"):
        d.mkdir(parents=True, exist_ok=True)
    (fake / "calls").write_text("")
    for name, text in (("python", FAKE_PYTHON), ("huggingface-cli", FAKE_HF_CLI)):
        (fake / "bin" / name).write_text(text)
        (fake / "bin" / name).chmod(0o755)
    if tokenized:
        (ws / "data" / "tokenized").mkdir(parents=True, exist_ok=True)
        (ws / "data" / "tokenized" / "meta.json").write_text("{}")
    env = {
        **os.environ,
        **{k: str(v) for k, v in task["envs"].items()},
        **{k: "" for k in task["secrets"]},
        "PATH": f"{fake / 'bin'}:{os.environ['PATH']}",
        "REAL_PYTHON": sys.executable,
        "FAKE_DIR": str(fake),
        "FAKE_WS": str(ws),
        "FAKE_TRAIN_EXIT": str(train_exit),
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": cloud, "region": "us-east-1"}),
        **env_overrides,
    }
    script = task["run"].replace("/workspace", str(ws))
    return ["bash", "-c", script], env, ws


def _call(calls: list[list[str]], module: str) -> list[str] | None:
    return next((c for c in calls if c[:2] == ["-m", module]), None)


def _sidecar_stopped(fake_dir: Path) -> bool:
    """The fake sidecar (a ``sleep``) is gone or a zombie waiting to be reaped by whoever adopted it."""
    stat = Path(f"/proc/{int((fake_dir / 'sidecar.pid').read_text())}/stat")
    for _ in range(50):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("train_exit, job_exit", [(0, 0), (3, 0), (4, 0), (75, 75), (1, 1), (2, 2), (5, 5), (6, 6)])
def test_run_script_maps_trainer_exits_to_job_exits(task, tmp_path, train_exit, job_exit):
    proc, calls, ws = _run(task, tmp_path, train_exit, LAMBDA_API_KEY="key-in-env")
    assert proc.returncode == job_exit, proc.stdout + proc.stderr
    sidecar = _call(calls, "x1_pretrain.budget_sidecar")
    assert sidecar == [
        "-m",
        "x1_pretrain.budget_sidecar",
        "--provider",
        "lambda",
        "--out",
        f"{ws}/budget.json",
        "--interval-min",
        "5",
    ]
    assert _sidecar_stopped(tmp_path / "fake")
    exported = _call(calls, "x1_pretrain.export_run") is not None
    assert exported == (train_exit in (0, 3, 4))
    assert "trainer says hello" in (ws / "logs" / "train.log").read_text()
    if train_exit in (3, 4):
        assert "NOT recovered" in proc.stdout


def test_train_and_watchdog_flags_are_real(task, tmp_path):
    _, calls, ws = _run(task, tmp_path, 0, LAMBDA_API_KEY="k", X1_EXPECTED_STEP_S="2.1")
    wd = _call(calls, "x1_pretrain.watchdog")
    assert wd is not None and wd[2:4] == ["--events-file", f"{ws}/logs/watchdog.jsonl"] and wd[4] == "--"
    assert wd[5:8] == ["python", "-m", "x1_pretrain.train"]
    args = train.build_parser().parse_args(wd[8:])  # every flag exists and parses
    assert (args.total_steps, args.checkpoint_every_steps, args.eval_every, args.log_every) == (33766, 1800, 1800, 10)
    assert args.resume_from_latest and args.budget_cap_usd == 35.0
    assert args.budget_curr_cost_uri == f"{ws}/budget.json" and args.mlflow_uri == f"file://{ws}/mlruns"
    assert args.inject_spike_at_step == 12000 and args.budget_expected_step_s == 2.1
    assert (ws / "configs").resolve() == REPO / "configs"


def test_data_download_tokenize_and_pile_fallback(task, tmp_path):
    proc, calls, ws = _run(task, tmp_path, 0, tokenized=False, LAMBDA_API_KEY="k", FAKE_HF_FAIL="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    downloads = [c for c in calls if c[0] == "huggingface-cli"]
    assert [c[2] for c in downloads] == ["HuggingFaceFW/fineweb-edu", "monology/pile-uncopyrighted"]
    tok = _call(calls, "x1_pretrain.tokenize_data")
    args = tokenize_data.build_parser().parse_args(tok[2:])
    assert args.input_dir == f"{ws}/data/pile-cc/test" and args.workers == 16 and args.val_fraction == 0.001
    assert "falling back to the Pile-CC slice" in proc.stdout


def test_clock_billing_needs_a_rate_and_counts_from_the_launch(task, tmp_path):
    proc, calls, _ = _run(task, tmp_path, 0, cloud="RunPod")
    assert proc.returncode == 2 and "X1_RATE_USD_PER_HR" in proc.stdout
    assert _call(calls, "x1_pretrain.watchdog") is None
    proc, calls, _ = _run(
        task, tmp_path, 0, cloud="RunPod", X1_RATE_USD_PER_HR="0.79", X1_RUN_STARTED_UTC="2026-05-23T03:00:00Z"
    )
    sidecar = _call(calls, "x1_pretrain.budget_sidecar")
    assert proc.returncode == 0 and sidecar[2:4] == ["--provider", "clock"]
    assert sidecar[-4:] == ["--rate-usd-per-hr", "0.79", "--started-utc", "2026-05-23T03:00:00Z"]


def test_a_new_vm_takes_the_tokens_and_logs_from_the_bucket_instead_of_making_them(task, tmp_path, s3env):
    """The first VM tokenizes and pushes the tokens and its logs (with x1's real `remote` command, against moto's
    S3 server); a preempted job's new VM, on an empty disk, pulls them, does not tokenize, carries on the logs,
    and passes the same --ckpt-remote to the trainer. Without X1_CKPT_REMOTE the script says what that costs."""
    keys = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    proc, calls, ws = _run(
        task, tmp_path / "vm1", 75, tokenized=False, LAMBDA_API_KEY="k", X1_CKPT_REMOTE=s3env, **keys
    )
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert _call(calls, "x1_pretrain.tokenize_data") is not None
    assert "no complete tokens in" in proc.stdout
    store = Store(RemoteURL.parse(s3env))
    assert {"data/tokenized/meta.json", "data/tokenized/x1-dir.json", "logs/cloud.log", "logs/train.log"} <= set(
        store.list_objects()
    )
    proc, calls, ws2 = _run(
        task, tmp_path / "vm2", 0, tokenized=False, LAMBDA_API_KEY="k", X1_CKPT_REMOTE=s3env, **keys
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _call(calls, "x1_pretrain.tokenize_data") is None and not [c for c in calls if c[0] == "huggingface-cli"]
    tokens = ("data", "tokenized", "meta.json")
    assert ws2.joinpath(*tokens).read_text() == ws.joinpath(*tokens).read_text()
    cloud_log = (ws2 / "logs" / "cloud.log").read_text()
    assert "interrupted after a clean checkpoint" in cloud_log and "finished (exit 0)" in cloud_log  # both VMs
    wd = _call(calls, "x1_pretrain.watchdog")
    assert wd is not None and wd[wd.index("--ckpt-remote") + 1] == s3env
    assert "finished (exit 0)" in store.get_bytes("logs/cloud.log").decode()  # pushed at exit
    proc, calls, _ = _run(task, tmp_path / "vm3", 0, LAMBDA_API_KEY="k")
    assert proc.returncode == 0 and "no X1_CKPT_REMOTE" in proc.stdout
    assert _call(calls, "x1_pretrain.remote") is None


def test_a_stop_reaches_the_trainer_and_the_logs_go_up_after_it_ended(task, tmp_path, s3env):
    """SIGTERM to the run script (a preemption, sky jobs cancel): it is passed to the trainer, the script waits
    for the trainer's exit 75, and only then pushes the logs, which hold the trainer's last line."""
    keys = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    cmd, env, ws = _script(
        task, tmp_path, 0, LAMBDA_API_KEY="k", X1_CKPT_REMOTE=s3env, FAKE_TRAIN_UNTIL_TERM="1", **keys
    )
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: (tmp_path / "fake" / "training").exists() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, out
    assert "trainer stopped by TERM" in (ws / "logs" / "train.log").read_text()
    pushed = Store(RemoteURL.parse(s3env)).get_bytes("logs/cloud.log")
    assert pushed is not None and "interrupted after a clean checkpoint" in pushed.decode()


def test_two_nodes_one_bill_one_rendezvous_and_the_head_alone_exports(task, tmp_path):
    """`--num-nodes 2`: the head bills both machines (the clock at one machine's rate, sidecar --nodes 2) and serves
    budget.json to the other node, whose watchdog reads it over HTTP; each node's watchdog runs torchrun with its
    SkyPilot node rank and the head's address (so the head holds rank 0); only the head exports the bundle."""
    import urllib.error
    import urllib.request

    from x1_pretrain.budget.serve import derive_token

    from .s3server import free_port

    port = free_port()
    common = {
        "LAMBDA_API_KEY": "k",
        "X1_RATE_USD_PER_HR": "1.10",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "1",
        "X1_BUDGET_PORT": str(port),
        "SKYPILOT_TASK_ID": "job-7",
    }
    cmd, env, ws = _script(task, tmp_path / "head", 0, FAKE_TRAIN_UNTIL_TERM="1", SKYPILOT_NODE_RANK="0", **common)
    head = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(
            lambda: (tmp_path / "head" / "fake" / "training").exists() or head.poll() is not None, timeout=60
        )
        assert head.poll() is None, head.communicate()[0]
        url = f"http://127.0.0.1:{port}/budget.json"
        assert wait_until(lambda: _answers(url), timeout=30)
        # the bill is served to the cluster's token only (derived alike on each node from the task's secrets)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 401
        token = derive_token({**{k: "" for k in task["secrets"]}, **common})
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        assert json.loads(urllib.request.urlopen(req, timeout=10).read()) == {"spent_usd": 0.1}
        proc, calls1, _ = _run(task, tmp_path / "node1", 0, SKYPILOT_NODE_RANK="1", **common)
        head.send_signal(signal.SIGTERM)
        out, _ = head.communicate(timeout=60)
    finally:
        if head.poll() is None:
            head.kill()
    assert proc.returncode == 0 and head.returncode == 75, proc.stdout + out
    calls0 = _calls(tmp_path / "head" / "fake")
    sidecar = _call(calls0, "x1_pretrain.budget_sidecar")
    assert sidecar[2:4] == ["--provider", "clock"] and sidecar[-4:] == ["--rate-usd-per-hr", "1.10", "--nodes", "2"]
    assert _call(calls1, "x1_pretrain.budget_sidecar") is None and _call(calls1, "x1_pretrain.export_run") is None
    for calls, rank, uri in ((calls0, 0, f"{ws}/budget.json"), (calls1, 1, url)):
        wd = _call(calls, "x1_pretrain.watchdog")
        assert wd is not None
        run = wd[wd.index("--") + 1 :]
        assert run[:11] == [
            "python",
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=1",
            f"--node-rank={rank}",
            "--master-addr=127.0.0.1",
            "--master-port=29500",
            "--rdzv-conf=timeout=3600",
            "-m",
            "x1_pretrain.train",
        ]
        assert run[run.index("--budget-curr-cost-uri") + 1] == uri
    assert "node 1 of 2: the head (127.0.0.1) bills every node" in proc.stdout
    assert (tmp_path / "node1" / "fake" / "budget_token").read_text() == token  # node 1's trainer sends it
    serving = next(c for c in calls0 if c[:2] == ["-m", "x1_pretrain.budget_serve"] and "--file" in c)
    assert serving[2:] == ["--file", f"{ws}/budget.json", "--bind", "127.0.0.1", "--port", str(port)]
    assert token not in " ".join(" ".join(c) for c in calls0 + calls1)  # never on a command line (ps)


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except urllib.error.HTTPError:  # an answer (401: no token)
        return True
    except OSError:
        return False


def test_skypilot_loads_the_task_and_each_cloud_supports_what_it_is_asked():
    """SkyPilot's own loader, offline. Skipped unless `sky` imports here or X1_SKYPILOT_PYTHON names a Python
    that has it (skypilot is not a dependency: it would downgrade packages this project uses)."""
    try:
        import sky  # noqa: F401

        python = sys.executable
    except ImportError:
        python = os.environ.get("X1_SKYPILOT_PYTHON", "")
        if not python:
            pytest.skip("skypilot not installed (set X1_SKYPILOT_PYTHON to a Python that has it)")
    code = (
        "import json, sys, sky\n"
        "t = sky.Task.from_yaml(sys.argv[1])\n"
        "out = []\n"
        "for r in t.resources:\n"
        "    r.cloud.check_features_are_supported(r, r.get_required_cloud_features())\n"
        "    out.append({'cloud': str(r.cloud), 'spot': r.use_spot, 'acc': r.accelerators, 'disk': r.disk_size,\n"
        "                'image': r.extract_docker_image(), 'recovery': r.job_recovery})\n"
        "print(json.dumps({'name': t.name, 'resources': out}))\n"
    )
    proc = subprocess.run(
        [python, "-c", code, str(DEPLOY / "skypilot.yaml")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    clouds = {r["cloud"]: r for r in data["resources"]}
    assert set(clouds) == {"Lambda", "RunPod"} and clouds["RunPod"]["spot"] and not clouds["Lambda"]["spot"]
    for r in clouds.values():
        assert r["acc"] == {"A100-80GB": 1} and r["disk"] >= 500 and r["image"] == IMAGE
        assert r["recovery"]["recover_on_exit_codes"] == [75, 7, 8]


# --- the image -------------------------------------------------------------------------------------------
def test_dockerfile_pins_the_image_and_keeps_its_torch():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert [ln for ln in lines if ln.startswith("FROM ")] == [f"FROM {IMAGE}"]
    assert ":latest" not in "\n".join(lines)
    assert "RUN bash deploy/install.sh" in lines and "RUN python -m x1_pretrain.tokenizer fetch" in lines
    assert [ln for ln in lines if ln.startswith("WORKDIR")][-1] == "WORKDIR /workspace"
    assert not re.search(r"pip install[^\n]*\btorch\b", text)
    install = (DEPLOY / "install.sh").read_text()
    subprocess.run(["bash", "-n", str(DEPLOY / "install.sh")], check=True)
    assert "pip install --no-deps ." in install and '-c "$constraints"' in install
    # everything the image copies exists
    for src in re.findall(r"^COPY (.+?) \S+$", text, re.M):
        for part in src.split():
            assert (REPO / part).exists(), part


@pytest.mark.skipif(
    shutil.which("docker") is None or not os.environ.get("X1_DOCKER_BUILD"),
    reason="set X1_DOCKER_BUILD=1 on a machine with docker and access to nvcr.io",
)
def test_docker_image_builds_and_imports():  # pragma: no cover - needs docker and ~15 GB
    subprocess.run(
        ["docker", "build", "-f", str(DEPLOY / "Dockerfile"), "-t", "x1-pretrain:test", str(REPO)], check=True
    )
    subprocess.run(
        ["docker", "run", "--rm", "x1-pretrain:test", "python", "-m", "x1_pretrain.tokenizer", "show"], check=True
    )
