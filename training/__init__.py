"""Generic multi-role GRPO engine: backbone with per-role adapters, generation backends, GRPO maths."""
