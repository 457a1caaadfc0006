"""The engine: strategy, cluster, compiled steps, the outer loop, checkpoints, summaries, losses, optimizers."""
