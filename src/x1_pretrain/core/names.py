"""Names other programs and files depend on (see docs/architecture.md, contracts)."""

from __future__ import annotations

from pathlib import Path

EXPERIMENT = "x1-pretraining"  # the MLflow experiment a run logs to unless --experiment says otherwise


MLFLOW_DB = "mlflow.db"  # the default store's file in --ckpt-dir (and its name in a checkpoint mirror)


def default_mlflow_uri(ckpt_dir: Path) -> str:
    """The trainer's MLflow store when no --mlflow-uri is given: sqlite beside the checkpoints."""
    return f"sqlite:///{ckpt_dir.resolve() / MLFLOW_DB}"


# Metric names (section/name_unit): the trainer writes them, the report and the tests read them; a reader
# that asks for a name nobody writes is caught by tests/test_architecture.py. Use these, never the strings.
BUDGET_DECAY_START_STEP = "budget/decay_start_step"
BUDGET_PLANNED_END_STEP = "budget/planned_end_step"
BUDGET_PROJECTED_USD = "budget/projected_usd"
BUDGET_SPENT_USD = "budget/spent_usd"
CHECKPOINT_FAILED = "checkpoint/failed"
CHECKPOINT_MB_PER_S = "checkpoint/mb_per_s"
CHECKPOINT_SAVE_S = "checkpoint/save_s"
CHECKPOINT_SIZE_MB = "checkpoint/size_mb"
RUN_RESTARTS = "run/restarts"
SPIKE_BASELINE_LOSS = "spike/baseline_loss"
SPIKE_CLIPPED = "spike/clipped"
SPIKE_DETECTED = "spike/detected"
SPIKE_GRAD_NORM = "spike/grad_norm"
SPIKE_INJECTED = "spike/injected"
SPIKE_LOSS = "spike/loss"
SPIKE_UPDATE_SKIPPED = "spike/update_skipped"
TRAIN_FIRST_STEP_S = "train/first_step_s"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_LOSS = "train/loss"
TRAIN_LR = "train/lr"
TRAIN_MFU = "train/mfu"
TRAIN_MFU_LAB_6N = "train/mfu_lab_6n"
TRAIN_MFU_NEWTON_SCHULZ = "train/mfu_newton_schulz"  # Muon's orthogonalisation, apart from the model's FLOPs
TRAIN_PARAM_NORM = "train/param_norm"
TRAIN_PEAK_MEM_GIB = "train/peak_mem_gib"
TRAIN_STEP_TIME_S = "train/step_time_s"
TRAIN_TOKENS_PER_S = "train/tokens_per_s"
TRAIN_TOKENS_SEEN = "train/tokens_seen"
VAL_LOSS = "val/loss"
VAL_BPB = "val/bpb"  # bits per byte of the val text: comparable across tokenizers
METRICS = frozenset(
    {
        BUDGET_DECAY_START_STEP,
        BUDGET_PLANNED_END_STEP,
        BUDGET_PROJECTED_USD,
        BUDGET_SPENT_USD,
        CHECKPOINT_FAILED,
        CHECKPOINT_MB_PER_S,
        CHECKPOINT_SAVE_S,
        CHECKPOINT_SIZE_MB,
        RUN_RESTARTS,
        SPIKE_BASELINE_LOSS,
        SPIKE_CLIPPED,
        SPIKE_DETECTED,
        SPIKE_GRAD_NORM,
        SPIKE_INJECTED,
        SPIKE_LOSS,
        SPIKE_UPDATE_SKIPPED,
        TRAIN_FIRST_STEP_S,
        TRAIN_GRAD_NORM,
        TRAIN_LOSS,
        TRAIN_LR,
        TRAIN_MFU,
        TRAIN_MFU_LAB_6N,
        TRAIN_MFU_NEWTON_SCHULZ,
        TRAIN_PARAM_NORM,
        TRAIN_PEAK_MEM_GIB,
        TRAIN_STEP_TIME_S,
        TRAIN_TOKENS_PER_S,
        TRAIN_TOKENS_SEEN,
        VAL_BPB,
        VAL_LOSS,
    }
)


EVAL_TASK_PREFIX = "eval/"  # eval/<task>/acc, eval/<task>/acc_norm and eval/<task>/n (items scored): in-loop


def eval_task_metric(task: str, metric: str) -> str:
    """The metric name of a task score: ``eval/hellaswag/acc_norm``."""
    return f"{EVAL_TASK_PREFIX}{task}/{metric}"


# MLflow tag names: written by the trainer, read by the report (the same test as the metrics).
TAG_ATTENTION_EFFECTIVE = "attention_effective"
TAG_BUDGET_ALERT_USD = "budget_alert_usd"
TAG_BUDGET_CAP_USD = "budget_cap_usd"
TAG_BUDGET_CURR_COST_URI = "budget_curr_cost_uri"
TAG_CHECKPOINT_FAILED = "checkpoint_failed"
TAG_CHECKPOINT_FAILURES = "checkpoint_failures"
TAG_COMPILE_FALLBACK = "compile_fallback"
TAG_COMPILE_MODE_EFFECTIVE = "compile_mode_effective"
TAG_COMPILE_SCOPE_EFFECTIVE = "compile_scope_effective"  # train.compile_scope, or blocks where torch needs it
TAG_CONFIG_CHANGED_ON_RESUME = "config_changed_on_resume"
TAG_CONFIG_FILE = "config_file"
TAG_DEVICE = "device"
TAG_DIVERGED_AT_STEP = "diverged_at_step"
TAG_END_REASON = "end_reason"
TAG_EVAL_TASKS_FAILED = "eval_tasks_failed"
TAG_EXIT_CODE = "exit_code"
TAG_FINAL_CHECKPOINT = "final_checkpoint"
TAG_FINAL_SAFETENSORS = "final_safetensors"
TAG_FINAL_SAFETENSORS_SHA256 = "final_safetensors_sha256"
TAG_FORCE_LAUNCH = "force_launch"
TAG_GIT_COMMIT = "git_commit"
TAG_HOST = "host"
TAG_KERNELS = "kernels"
TAG_RESTARTS = "restarts"
TAG_SPIKE_BATCHES = "spike_batches"
TAG_SPIKE_INJECTION = "spike_injection"
TAG_SPIKE_INJECTION_SKIPPED = "spike_injection_skipped"
TAG_SPIKE_INJECT_AT_STEP = "spike_inject_at_step"
OLD_TAG_BUDGET_SOURCE = "budget_source"  # TAG_BUDGET_CURR_COST_URI before it was renamed (older runs)
TAGS = frozenset(
    {
        TAG_ATTENTION_EFFECTIVE,
        TAG_BUDGET_ALERT_USD,
        TAG_BUDGET_CAP_USD,
        TAG_BUDGET_CURR_COST_URI,
        TAG_CHECKPOINT_FAILED,
        TAG_CHECKPOINT_FAILURES,
        TAG_COMPILE_FALLBACK,
        TAG_COMPILE_MODE_EFFECTIVE,
        TAG_COMPILE_SCOPE_EFFECTIVE,
        TAG_CONFIG_CHANGED_ON_RESUME,
        TAG_CONFIG_FILE,
        TAG_DEVICE,
        TAG_DIVERGED_AT_STEP,
        TAG_END_REASON,
        TAG_EVAL_TASKS_FAILED,
        TAG_EXIT_CODE,
        TAG_FINAL_CHECKPOINT,
        TAG_FINAL_SAFETENSORS,
        TAG_FINAL_SAFETENSORS_SHA256,
        TAG_FORCE_LAUNCH,
        TAG_GIT_COMMIT,
        TAG_HOST,
        TAG_KERNELS,
        TAG_RESTARTS,
        TAG_SPIKE_BATCHES,
        TAG_SPIKE_INJECTION,
        TAG_SPIKE_INJECTION_SKIPPED,
        TAG_SPIKE_INJECT_AT_STEP,
    }
)
