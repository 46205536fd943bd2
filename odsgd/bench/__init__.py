"""Benchmarks and studies: `python -m odsgd.bench SUBCOMMAND [options]` (or `odsgd-bench`).

Subcommands are modules of this package with a `main(argv)`; importing this package imports
none of them (their jobs also run on parameter servers, where little may be imported)."""
import importlib
import sys

SUBCOMMANDS = {
    "throughput": "odsgd.bench.throughput",    # SSGD vs ASGD vs OD-SGD on a shaped network
    "convergence": "odsgd.bench.convergence",  # accuracy per mode and seed
    "time-to-accuracy": "odsgd.bench.time_to_accuracy",  # accuracy against time, real images
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print("usage: python -m odsgd.bench {%s} [options]   (--help for each)"
              % ",".join(SUBCOMMANDS), file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    return module.main(argv[1:])
