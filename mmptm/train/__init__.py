"""Training: optimiser and schedule, and the Trainer (one process or DDP ranks, exact resume)."""
