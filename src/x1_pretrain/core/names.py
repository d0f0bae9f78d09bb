"""Names other programs and files depend on (see docs/architecture.md, contracts)."""

from __future__ import annotations

EXPERIMENT = "x1-pretraining"   # the MLflow experiment a run logs to unless --experiment says otherwise
