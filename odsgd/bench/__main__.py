import sys

from odsgd.bench import SUBCOMMANDS, main

# The planner prints the step model's predictions for a cluster; it runs no job.
SUBCOMMANDS.setdefault("plan", "odsgd.bench.plan")
sys.exit(main())
