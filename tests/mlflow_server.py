"""A real MLflow tracking server (MLflow's own Flask app over a sqlite store) behind HTTP Basic auth, on
127.0.0.1, in a process of its own: what a team's password-protected MLflow looks like to the trainer.

    with MlflowServer(tmp_path, "alice", "s3cr3t") as server:
        uri = server.uri_with_password   # http://alice:s3cr3t@127.0.0.1:PORT/

Requests without the right credentials get 401; ``authorized()`` counts the ones that had them (so a test can
tell the password was really used).
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

from .conftest import REPO, seed_store


class MlflowServer:
    def __init__(self, root: Path, user: str, password: str, timeout_s: float = 60.0) -> None:
        self.root, self.user, self.password = root, user, password
        seed_store(root)  # a migrated store: the server starts in seconds
        self.ready, self.log = root / "server.ready", root / "server.log"
        env = {**os.environ, "X1_TEST_MLFLOW_AUTH": f"{user}:{password}"}  # not on its command line
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.mlflow_server", str(root)],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the MLflow server did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.port = int(self.ready.read_text())

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def uri_with_password(self) -> str:
        return f"http://{self.user}:{self.password}@127.0.0.1:{self.port}/"

    def authorized(self) -> int:
        counter = self.root / "authorized"
        return len(counter.read_text()) if counter.exists() else 0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> MlflowServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(root: Path) -> None:
    from mlflow.server import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR

    os.environ[BACKEND_STORE_URI_ENV_VAR] = f"sqlite:///{root.resolve()}/mlflow.db"  # seeded: already migrated
    os.environ[ARTIFACT_ROOT_ENV_VAR] = (root.resolve() / "artifacts").as_uri()
    from mlflow.server import app
    from werkzeug.serving import make_server

    expected = "Basic " + base64.b64encode(os.environ["X1_TEST_MLFLOW_AUTH"].encode()).decode()
    counter = root / "authorized"

    def guarded(environ, start_response):
        if environ.get("HTTP_AUTHORIZATION") != expected:
            start_response(
                "401 Unauthorized", [("WWW-Authenticate", 'Basic realm="mlflow"'), ("Content-Type", "text/plain")]
            )
            return [b"credentials required\n"]
        with open(counter, "a") as f:
            f.write(".")
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, guarded, threaded=True)
    (root / "server.ready.tmp").write_text(str(server.server_port))
    os.replace(root / "server.ready.tmp", root / "server.ready")
    server.serve_forever()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
