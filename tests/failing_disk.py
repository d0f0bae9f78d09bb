"""Run the trainer with a disk that fills up at chosen checkpoints: ``python tests/failing_disk.py STEPS -- ARGS``.

STEPS is a comma list of steps whose checkpoint write fails with ENOSPC part-way (after the model file is
written), ``N+`` meaning step N and every later one. Everything else is the real trainer and the real
checkpoint code: the failure is raised where a full disk raises it, inside the step-dir write."""

from __future__ import annotations

import errno
import os
import sys


def failing(spec: str):
    steps, from_step = set(), None
    for part in filter(None, spec.split(",")):
        if part.endswith("+"):
            from_step = int(part[:-1])
        else:
            steps.add(int(part))
    return lambda step: step in steps or (from_step is not None and step >= from_step)


def main() -> int:
    spec, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
    fails = failing(spec)
    from x1_pretrain.ckpt import checkpoint as ck

    real = ck._fill_step_dir

    def fill(tmp, snap):
        if not fails(snap.step):
            return real(tmp, snap)
        (tmp / ck.MODEL_FILE).write_bytes(b"\0" * 4096)  # part of the write landed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / ck.OPTIM_FILE))

    ck._fill_step_dir = fill
    from x1_pretrain import train

    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())
