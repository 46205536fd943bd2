import sys

from odsgd.bench import SUBCOMMANDS, main

# The planner prints the step model's predictions for a cluster; it runs no job.
SUBCOMMANDS.setdefault("plan", "odsgd.bench.plan")
# The fault sweep of docs/reliability.md on emulated hosts (root, sshd).
SUBCOMMANDS.setdefault("faults", "odsgd.bench.faults")
sys.exit(main())
