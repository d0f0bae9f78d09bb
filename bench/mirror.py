"""What the checkpoint mirror costs a training step, and how fast it uploads against boto3 on its own.

    .venv/bin/python bench/mirror.py [--model-mb 200] [--steps 60] [--ckpt-every 10] [--repeats 3]

A real S3 server (moto's standalone server, on 127.0.0.1 in its own process) and a fixed training step (the
tiny config's forward + backward + AdamW on the CPU, torch limited to one thread so the mirror's thread has the
other core, as it has a host core beside a GPU). Two runs of the same loop in the same process, alternated
``--repeats`` times: checkpoints written by x1's Checkpointer every ``--ckpt-every`` steps (async, as the
trainer does), without and with the mirror (``Mirror.checkpoint`` in ``on_saved``, uploads off the training
thread). The checkpoint carries ``--model-mb`` of weights (the lab's model + AdamW state: ~600 MB), so the
uploads are as large as the lab's. Prints the median step time of each and the ratio (goal: within 2 %).
Then the upload throughput of one ``--model-mb`` file: x1's ``Store.put_file`` against boto3's ``upload_file``
with its default transfer settings, each the best of ``--repeats``.

On one machine the server's own CPU competes with training (on a cloud GPU host the store is elsewhere), so
the ratio here is an upper bound of what the mirror costs.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def _server(log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "w") as out:
        # niced: on a GPU host the store's CPU is another machine's, not the trainer's
        proc = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit("moto_server did not start (pip install -e '.[test]': moto[s3,iam], flask, flask-cors)")


def _loop(steps: int, ckpt_every: int, ckpt_dir: Path, model_mb: float, mirror) -> list[float]:
    """Step times of a fixed training step with an async checkpoint every ``ckpt_every`` steps."""
    import torch

    from x1_pretrain.ckpt.checkpointer import CheckpointCalls, Checkpointer
    from x1_pretrain.core import config as C
    from x1_pretrain.model.transformer import Transformer, state_dict_for_saving

    cfg = C.load(str(REPO / "configs" / "x1-tiny-cpu.yaml"), {}, ["model.seq_len=64"])
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ballast = torch.randn(int(model_mb * 1e6 / 4))  # the checkpoint's size: the lab's weights + AdamW moments
    x = torch.randint(0, cfg.model.vocab_size, (4, 64))

    def on_saved(step, path, secs, size):
        if mirror is not None:
            mirror.checkpoint(path)

    calls = CheckpointCalls(
        lambda m: {**state_dict_for_saving(m), "ballast": ballast},
        lambda run, state: {"step": state.step},
        log=lambda s: None,
        on_saved=on_saved,
    )
    chk = Checkpointer(ckpt_dir, keep_last=2, async_save=True, calls=calls)

    class Run:
        raw_model, optimizer = model, opt

    class State:
        step = 0

    times = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        model(x, x).backward()  # the mean cross-entropy (x's own tokens as targets: the work is what counts)
        opt.step()
        opt.zero_grad(set_to_none=True)
        State.step = step
        if step % ckpt_every == 0:
            chk.save(Run, State, "periodic")
        times.append(time.perf_counter() - t0)
    chk.wait()
    if mirror is not None:
        mirror.drain(600)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-mb", type=float, default=200.0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="x1-bench-mirror-"))
    proc, endpoint = _server(work / "moto.log")
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    try:
        import boto3

        from x1_pretrain.ckpt.mirror import Mirror
        from x1_pretrain.ckpt.objstore import RemoteURL, Store

        boto3.client("s3").create_bucket(Bucket="x1-bench")
        store = Store(RemoteURL.parse("s3://x1-bench/run"))
        off: list[float] = []
        on: list[float] = []
        sent = 0
        for r in range(args.repeats):
            off += _loop(args.steps, args.ckpt_every, work / f"off-{r}", args.model_mb, None)
            mirror = Mirror(store, work / f"on-{r}", keep_last=2, log=lambda s: None, upload_process=True).start()
            on += _loop(args.steps, args.ckpt_every, work / f"on-{r}", args.model_mb, mirror)
            sent += mirror.uploaded_bytes
            mirror.close()
        a, b = statistics.median(off), statistics.median(on)
        print(
            f"step time, median of {len(off)} steps each ({args.steps} steps x {args.repeats}, a "
            f"{args.model_mb:g} MB checkpoint every {args.ckpt_every}):"
        )
        print(f"  without the mirror {a * 1e3:8.2f} ms   mean {statistics.mean(off) * 1e3:8.2f} ms")
        print(
            f"  with the mirror    {b * 1e3:8.2f} ms   mean {statistics.mean(on) * 1e3:8.2f} ms   "
            f"({sent / 1e6:,.0f} MB uploaded)"
        )
        print(
            f"  ratio with/without: median {b / a:.3f}, mean {statistics.mean(on) / statistics.mean(off):.3f} "
            "(goal: within 1.02)"
        )
        blob = work / "blob"
        with open(blob, "wb") as f:
            f.write(os.urandom(int(args.model_mb * 1e6)))
        x1_s, raw_s = [], []
        client = boto3.client("s3")
        for r in range(args.repeats):
            t0 = time.perf_counter()
            store.put_file(blob, f"blob-x1-{r}")
            x1_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            client.upload_file(str(blob), "x1-bench", f"run/blob-boto3-{r}")
            raw_s.append(time.perf_counter() - t0)
        mb = args.model_mb
        print(
            f"upload of one {mb:g} MB file, best of {args.repeats}: x1 Store.put_file {mb / min(x1_s):,.0f} MB/s, "
            f"boto3 upload_file {mb / min(raw_s):,.0f} MB/s: ratio {min(raw_s) / min(x1_s):.2f}"
        )
    finally:
        proc.terminate()
        proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
