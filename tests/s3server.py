"""A real S3 server on 127.0.0.1 for the mirror's tests: moto's standalone server in its own process, with IAM
authentication on (a wrong key is refused as by AWS), a bucket and a key that may use it; and a TCP proxy in
front of it that can be paused, so an upload can be caught in the middle, or kept refusing connections until the
test lets the store come up."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

BUCKET = "x1-runs"
POLICY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto_server on a free port; ``env`` holds the variables a client needs (endpoint, a valid key)."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # moto authenticates every request after the first four (bucket, user, key, policy: made below)
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4", "MOTO_CALL_RESET_API": "false"}
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self._wait_listening(log)
        import boto3

        setup = dict(
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="x1")
        key = iam.create_access_key(UserName="x1")["AccessKey"]
        iam.put_user_policy(UserName="x1", PolicyName="s3", PolicyDocument=POLICY)
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def _wait_listening(self, log: Path) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited: {log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("moto_server did not listen within 60 s")

    def client(self, **env: str):
        import boto3

        e = {**self.env, **env}
        return boto3.client(
            "s3",
            endpoint_url=e["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id=e["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=e["AWS_SECRET_ACCESS_KEY"],
        )

    def keys(self, prefix: str = "") -> dict[str, int]:
        out: dict[str, int] = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out

    def get(self, key: str) -> bytes:
        return self.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_METHODS = (b"GET", b"PUT", b"POST", b"HEAD", b"DELETE")


def _in_a_request_line(data: bytes, wanted: tuple[bytes, ...]) -> bool:
    """Whether an HTTP request line in ``data`` (method and key) holds one of ``wanted``: never a body, whose
    bytes may name anything (an MLflow store names the checkpoint dirs in its tags)."""
    return any(w in line for line in data.split(b"\r\n") if line.split(b" ", 1)[0] in _METHODS for w in wanted)


class Proxy:
    """A TCP proxy on 127.0.0.1 to ``port``. ``pause()`` stops moving bytes (an upload hangs mid-way, as over a
    dead link); ``resume()`` moves them again; ``refusing`` closes new connections (a store that is down).
    ``hold_on``: pause when a request's line (its method and key) carries those bytes, before it reaches the
    server. ``bytes_up`` counts what went to the server. ``listening=False``: the port is bound but refuses
    connections (ECONNREFUSED, as a store whose server is not up yet) until ``listen()``."""

    def __init__(self, port: int, listening: bool = True) -> None:
        self.target = port
        self.flowing = threading.Event()
        self.flowing.set()
        self.refusing = False  # True: every new connection is closed at once (a store that is down)
        # pause by itself before forwarding a request that holds these bytes (or any of a tuple of them)
        self.hold_on: bytes | tuple[bytes, ...] | None = None
        self.bytes_up = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._conns: list[socket.socket] = []
        self.listening = False
        if listening:
            self.listen()

    def listen(self) -> None:
        """Take connections from now on (the store comes up)."""
        if not self.listening:
            self.listening = True
            self.sock.listen(64)
            threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            self._conns += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        tail = b""
        try:
            while True:
                self.flowing.wait()
                data = src.recv(65536)
                if not data:
                    break
                held = (self.hold_on,) if isinstance(self.hold_on, bytes) else self.hold_on
                if up and held is not None and _in_a_request_line(tail + data, held):
                    self.hold_on = None
                    self.flowing.clear()
                tail = data[-256:]
                self.flowing.wait()
                dst.sendall(data)
                if up:
                    self.bytes_up += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def pause(self) -> None:
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    def close(self) -> None:
        self.flowing.set()
        self.sock.close()
        for c in self._conns:
            c.close()
