"""Two assumptions the config's ``budget:`` section and the pure money arithmetic (``budget/money.py``) share.
Standard library only, so the arithmetic stays pure; every other default lives in ``core/config.py``."""

DEFAULT_MFU = 0.40  # honest MFU assumed when no step time is measured (docs/errata.md, 1; bench/gpu_check.sh)
DEFAULT_RESERVE_MIN = 10.0  # the final checkpoint, export_run and shutdown, billed after the last step
