"""The built-in demo corpus: CPython's ``pydoc_data.topics``, real English prose on every install.

Written as a parquet shard with a ``text`` column, so the demo goes through the same path as FineWeb-Edu.
"""

from __future__ import annotations

import os
from pathlib import Path


def demo_documents() -> list[str]:
    import pydoc_data.topics

    topics: dict[str, str] = pydoc_data.topics.topics
    return [topics[k] for k in sorted(topics)]


def write_demo_corpus(directory: Path, row_group_size: int = 16) -> Path:
    """Write ``pydoc_topics.parquet`` into ``directory`` (atomically) and return its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pydoc_topics.parquet"
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    table = pa.table({"text": demo_documents()})
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    os.replace(tmp, path)
    return path
