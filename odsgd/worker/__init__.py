"""The worker side: the `dist_odsgd` store (kvstore) and its step: the key plan and key
groups, the exchange of rounds, the local update, the collective agreement between workers,
the Trainer/Module hook, evaluation with the global weights, checkpoints and their states, a
failed step and the alarm that ends the other workers, a trace of each worker."""
