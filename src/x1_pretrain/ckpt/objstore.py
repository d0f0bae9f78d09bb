"""An S3-compatible object store, ``s3://BUCKET/PREFIX``, for the checkpoint mirror (``ckpt/mirror.py``).

The endpoint and the credentials come from the standard AWS variables, read by botocore itself
(``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, or a profile), so AWS S3, Cloudflare R2, Backblaze B2, MinIO and
RunPod's S3 API are all the same code. Every call has a connect and a read timeout; every failure becomes a
:class:`StoreError` whose ``kind`` says what a caller can do about it, and whose text never carries a key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import redact
from ..core.errors import X1Error

SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "InvalidToken",
    "ExpiredToken",
    "AuthorizationHeaderMalformed",
    "InvalidSecurity",
    "403",
    "Forbidden",
    "Unauthorized",
    "401",
}
MISSING_KEY_CODES = {"NoSuchKey", "404", "NotFound"}
CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412"}  # a conditional write that lost
CONDITIONAL_PARAMS = ("IfMatch", "IfNoneMatch")  # PutObject's conditional writes: botocore >= 1.35.69 knows both
BOTO3_FIX = "pip install 'boto3>=1.35.69' (the first whose botocore has IfMatch and IfNoneMatch on PutObject)"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
# the fix named in every credential error
CREDENTIALS_FIX = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for R2, B2, MinIO or "
    "RunPod) to a key that may read, write and delete under the prefix"
)


@dataclass(frozen=True)
class RemoteURL:
    bucket: str
    prefix: str  # no leading or trailing slash; "" is the bucket's root

    @classmethod
    def parse(cls, url: str, what: str = "--ckpt-remote") -> RemoteURL:
        m = re.match(r"^s3://([^/]+)/?(.*)$", url.strip())
        if not m:
            raise X1Error(
                f"{what} {url!r}: expected s3://BUCKET/PREFIX (an S3-compatible store; the endpoint comes "
                "from AWS_ENDPOINT_URL for R2, B2, MinIO or RunPod)"
            )
        bucket, prefix = m.group(1), m.group(2).strip("/")
        if not _BUCKET_RE.match(bucket):
            raise X1Error(
                f"{what} {url!r}: {bucket!r} is not a valid bucket name (3-63 lower-case letters, "
                "digits, dots and hyphens)"
            )
        return cls(bucket, prefix)

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def rel(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class StoreError(Exception):
    """A store call that failed. ``kind``: ``auth`` (credentials refused or missing), ``bucket`` (no such bucket),
    ``unreachable`` (connection, timeout, a 5xx: worth retrying), ``conflict`` (a conditional write lost: the
    object changed since it was read, or exists already), ``unsupported`` (the conditional writes cannot be made:
    a botocore too old to know them, or a store that does not implement them; retrying cannot mend it) or
    ``other``."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail

    @property
    def fatal_at_launch(self) -> bool:
        return self.kind in ("auth", "bucket", "unsupported")


def scrub(text: str) -> str:
    """``text`` without the values of the AWS secret variables, nor a signed URL's query."""
    for var in SECRET_VARS:
        value = os.environ.get(var, "")
        if len(value) >= 4:
            text = text.replace(value, "***")
    return re.sub(r"(X-Amz-[A-Za-z-]+|Signature|AWSAccessKeyId)=[^&\s'\"]+", r"\1=***", text)


def classify(e: BaseException) -> StoreError:
    """A botocore (or boto3 transfer) exception as a :class:`StoreError`."""
    from boto3 import exceptions as b3x
    from botocore import exceptions as bx

    if isinstance(e, StoreError):
        return e
    if isinstance(e, (b3x.S3UploadFailedError, b3x.RetriesExceededError)):
        cause = e.__cause__ or e.__context__  # upload_file wraps the ClientError it got
        if (
            cause is not None
            and cause is not e
            and not isinstance(cause, (b3x.S3UploadFailedError, b3x.RetriesExceededError))
        ):
            try:
                return classify(cause)
            except Exception:
                pass
        text = scrub(f"{type(e).__name__}: {e}")
        return StoreError("auth" if any(c in text for c in AUTH_CODES if len(c) > 3) else "unreachable", text)
    if isinstance(e, bx.ParamValidationError) and any(f'"{p}"' in str(e) for p in CONDITIONAL_PARAMS):
        import botocore

        return StoreError(
            "unsupported",
            f"botocore {botocore.__version__} does not know PutObject's IfMatch / "
            f"IfNoneMatch, the conditional writes x1 needs ({' '.join(scrub(str(e)).split())[:160]}); "
            f"{BOTO3_FIX}",
        )
    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return StoreError("auth", f"no usable credentials ({scrub(str(e))})")
    if isinstance(e, bx.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        text = scrub(f"{code}: {err.get('Message', '')}".strip(": "))
        if code in AUTH_CODES or status in (401, 403):
            return StoreError("auth", text)
        if code == "NoSuchBucket":
            return StoreError("bucket", text)
        if code in CONFLICT_CODES or status == 412:
            return StoreError("conflict", text)
        if code == "NotImplemented" or status == 501:
            return StoreError(
                "unsupported",
                f"{text}: the store does not implement a request x1 makes (the "
                "conditional writes If-Match / If-None-Match on PutObject: AWS S3, R2 and MinIO take "
                "them); use a store that does",
            )
        if status >= 500 or code in ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"):
            return StoreError("unreachable", text)
        return StoreError("other", text)
    if isinstance(
        e,
        (
            bx.EndpointConnectionError,
            bx.ConnectTimeoutError,
            bx.ReadTimeoutError,
            bx.ConnectionClosedError,
            bx.ProxyConnectionError,
            ConnectionError,
            TimeoutError,
        ),
    ):
        return StoreError("unreachable", scrub(f"{type(e).__name__}: {e}"))
    if isinstance(e, (bx.BotoCoreError, b3x.Boto3Error)):
        return StoreError("other", scrub(f"{type(e).__name__}: {e}"))
    raise e


class Store:
    """One bucket and prefix. Thread-safe for one caller at a time (the mirror's thread; a resume's download)."""

    def __init__(
        self, url: RemoteURL, connect_timeout_s: float = 10.0, read_timeout_s: float = 60.0, attempts: int = 3
    ) -> None:
        self.url = url
        self.timeouts = (connect_timeout_s, read_timeout_s, attempts)
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            connect, read, attempts = self.timeouts
            try:
                self._client = boto3.session.Session().client(
                    "s3",
                    config=Config(
                        connect_timeout=connect,
                        read_timeout=read,
                        signature_version="s3v4",
                        retries={"max_attempts": attempts, "mode": "standard"},
                    ),
                )
            except ValueError as e:  # botocore's words for a malformed AWS_ENDPOINT_URL or region
                raise X1Error(
                    f"--ckpt-remote {self.url}: the S3 client cannot be made ({scrub(str(e))}); check "
                    "AWS_ENDPOINT_URL (https://host[:port]) and AWS_DEFAULT_REGION"
                ) from None
        return self._client

    def endpoint(self) -> str:
        try:
            return scrub(redact.url(str(self.client.meta.endpoint_url)) or "")
        except Exception as e:  # a malformed AWS_ENDPOINT_URL
            return f"(no endpoint: {scrub(str(e))})"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if isinstance(e, OSError) and not isinstance(e, ConnectionError):
                raise  # a local file problem is the caller's
            raise classify(e) from None

    def check(self) -> None:
        """The bucket exists and the credentials may write and delete under the prefix (one small probe object);
        StoreError otherwise. A 404 on the bucket is ``bucket``."""
        try:
            self.client.head_bucket(Bucket=self.url.bucket)
        except Exception as e:
            err = classify(e)
            if err.kind == "other" and "404" in err.detail:
                raise StoreError("bucket", f"no bucket {self.url.bucket!r} at {self.endpoint()}") from None
            raise err from None
        probe = f".x1-write-check-{os.getpid()}"
        try:  # conditional, as the mirror's writes are: a client or store without them is refused here
            self.put_bytes(b"x1 checks that it may write here\n", probe, if_none_match=True)
        except StoreError as e:
            if e.kind != "conflict":  # a probe an earlier process of this pid left: the condition was understood
                raise
        self.delete([probe])

    def put_file(self, path: Path, rel: str, metadata: dict[str, str] | None = None) -> None:
        from boto3.s3.transfer import TransferConfig

        # no transfer threads: they are not daemons, so a hung upload would hold the process's exit past
        # --stop-grace-s; the mirror's own (daemon) thread does the work
        config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, use_threads=False)
        extra = {"Metadata": metadata} if metadata else None
        self._call(
            self.client.upload_file, str(path), self.url.bucket, self.url.key(rel), Config=config, ExtraArgs=extra
        )

    def head(self, rel: str) -> tuple[int, dict[str, str]] | None:
        """(size, user metadata) of an object, or None when there is no such key."""
        try:
            out = self._call(self.client.head_object, Bucket=self.url.bucket, Key=self.url.key(rel))
        except StoreError as e:
            if e.detail.split(":")[0] in MISSING_KEY_CODES:
                return None
            raise
        return int(out.get("ContentLength", 0)), dict(out.get("Metadata") or {})

    def put_bytes(
        self,
        data: bytes,
        rel: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Write an object; ``if_match`` (an ETag read before) or ``if_none_match`` (the key must not exist) make
        it conditional: a write that lost the race is a StoreError of kind ``conflict`` and changes nothing."""
        extra: dict[str, Any] = {"Metadata": metadata} if metadata else {}
        if if_match is not None:
            extra["IfMatch"] = if_match
        if if_none_match:
            extra["IfNoneMatch"] = "*"
        self._call(self.client.put_object, Bucket=self.url.bucket, Key=self.url.key(rel), Body=data, **extra)

    def get_tagged(self, rel: str) -> tuple[bytes, str] | None:
        """(bytes, ETag) of an object, for a conditional write after it; None when there is no such key."""
        try:
            out = self._call(self.client.get_object, Bucket=self.url.bucket, Key=self.url.key(rel))
        except StoreError as e:
            if e.detail.split(":")[0] in MISSING_KEY_CODES:
                return None
            raise
        return out["Body"].read(), str(out.get("ETag", ""))

    def abort_uploads(self, started_before: float, mine: Any = None) -> list[str]:
        """Abort the multipart uploads under this prefix (and only there) started before ``started_before``
        (unix seconds) whose relative key ``mine(rel)`` accepts (default: all): what a killed process left,
        whose parts are billed until aborted. Returns their relative keys."""
        prefix = self.url.key("") if self.url.prefix else ""
        done: list[str] = []
        pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.url.bucket, Prefix=prefix)
        try:
            uploads = [u for page in pages for u in page.get("Uploads", [])]
        except Exception as e:
            raise classify(e) from None
        for u in uploads:
            initiated = u.get("Initiated")
            when = initiated.timestamp() if hasattr(initiated, "timestamp") else 0.0
            if (
                not str(u["Key"]).startswith(prefix)
                or when >= started_before
                or (mine is not None and not mine(self.url.rel(u["Key"])))
            ):
                continue
            self._call(self.client.abort_multipart_upload, Bucket=self.url.bucket, Key=u["Key"], UploadId=u["UploadId"])
            done.append(self.url.rel(u["Key"]))
        return done

    def get_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None when there is no such key."""
        try:
            return self._call(self.client.get_object, Bucket=self.url.bucket, Key=self.url.key(rel))["Body"].read()
        except StoreError as e:
            if e.detail.split(":")[0] in MISSING_KEY_CODES:
                return None
            raise

    def get_file(self, rel: str, path: Path) -> None:
        self._call(self.client.download_file, self.url.bucket, self.url.key(rel), str(path))

    def list_objects(self, rel_prefix: str = "") -> dict[str, int]:
        """{relative key: size} of every object under ``rel_prefix``."""
        out: dict[str, int] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.url.bucket, Prefix=self.url.key(rel_prefix)
        )
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    out[self.url.rel(obj["Key"])] = int(obj["Size"])
        except Exception as e:
            raise classify(e) from None
        return out

    def delete(self, rels: list[str]) -> None:
        """Delete keys (absent ones are fine); a key the credentials may not delete is a StoreError."""
        for i in range(0, len(rels), 1000):
            chunk = [{"Key": self.url.key(r)} for r in rels[i : i + 1000]]
            if not chunk:
                continue
            out = self._call(
                self.client.delete_objects, Bucket=self.url.bucket, Delete={"Objects": chunk, "Quiet": True}
            )
            errors = [e for e in (out or {}).get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                code = str(errors[0].get("Code", ""))
                raise StoreError(
                    "auth" if code in AUTH_CODES else "other",
                    scrub(f"{code}: {errors[0].get('Message', '')} ({len(errors)} key(s) not deleted)"),
                )


def launch_error(store: Store, e: StoreError) -> X1Error | None:
    """What a failed check means to the user (exit 2 naming the fix), or None for ``unreachable``: the only kind
    that waiting can mend (a connection refused or timed out, a 5xx)."""
    if e.kind == "auth":
        return X1Error(
            f"--ckpt-remote {store.url}: the store at {store.endpoint()} refused the credentials "
            f"({e.detail}); {CREDENTIALS_FIX}"
        )
    if e.kind == "bucket":
        return X1Error(
            f"--ckpt-remote {store.url}: {e.detail}; create the bucket first (aws s3 mb "
            f"s3://{store.url.bucket}, or the provider's console) or fix the name"
        )
    if e.kind == "unsupported":
        return X1Error(f"--ckpt-remote {store.url}: {e.detail}")
    if e.kind == "other":
        return X1Error(
            f"--ckpt-remote {store.url}: the store at {store.endpoint()} refused the check ({e.detail});"
            " check AWS_DEFAULT_REGION (the bucket's region; R2: auto) and AWS_ENDPOINT_URL"
        )
    return None


def launch_check(store: Store, log: Any) -> bool:
    """At launch: refused credentials or a missing bucket are an X1Error (exit 2) naming the fix; a store that
    cannot be reached is a warning (the mirror catches up later). True when the store answered."""
    try:
        store.check()
    except StoreError as e:
        err = launch_error(store, e)
        if err is not None:
            raise err from None
        log(
            f"WARNING: --ckpt-remote {store.url} cannot be reached now ({e.detail}); training goes on with local "
            "checkpoints and the mirror catches up when the store answers"
        )
        return False
    return True
