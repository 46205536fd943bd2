"""What every side shares: the ODSGD_* settings (config), the learning rates and schedule
counts (rates), atomic state files (state_files) and the index of whole checkpoints
(checkpoint_index). Imports nothing of the worker, server or cluster side, and no MXNet at
module level: the servers and the launcher read it."""
