"""x1_pretrain: one reproducible, budget-capped LLM pretraining run on a rented GPU."""

__version__ = "0.1.0"
