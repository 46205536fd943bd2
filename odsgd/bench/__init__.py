"""Benchmarks and studies: `python -m odsgd.bench SUBCOMMAND [options]` (or `odsgd-bench`).

Subcommands are modules of this package with a `main(argv)`; importing this package imports
none of them (their jobs also run on parameter servers, where little may be imported)."""
import importlib
import signal
import sys

SUBCOMMANDS = {
    "throughput": "odsgd.bench.throughput",    # SSGD vs ASGD vs OD-SGD on a shaped network
    "convergence": "odsgd.bench.convergence",  # accuracy per mode and seed
    "time-to-accuracy": "odsgd.bench.time_to_accuracy",  # accuracy against time, real images
    "timeline": "odsgd.bench.timeline",        # a few steps per worker, per mode, drawn
    "plan": "odsgd.bench.plan",                # the step model's predictions; runs no job
    "rounds": "odsgd.bench.rounds",            # answers' spread across workers, from timelines
    "faults": "odsgd.bench.faults",            # the fault sweep of docs/reliability.md
    "goodput": "odsgd.bench.goodput",          # TCP payload through a shaped emulated NIC
    "replan": "odsgd.bench.replan",            # recorded runs' predictions, model changed
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print("usage: python -m odsgd.bench {%s} [options]   (--help for each)"
              % ",".join(SUBCOMMANDS), file=sys.stderr)
        return 2
    # SIGTERM ends a benchmark as Ctrl-C does: the running job is ended with it (run_job's
    # handler), instead of the benchmark dying alone and leaving its job behind.
    signal.signal(signal.SIGTERM, _interrupt)
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    try:
        return module.main(argv[1:])
    except KeyboardInterrupt as stop:
        print("odsgd.bench %s: interrupted (%s); its running job was ended"
              % (argv[0], stop or "Ctrl-C"), file=sys.stderr)
        return 130


def _interrupt(signum, _frame):
    raise KeyboardInterrupt("signal %d" % signum)
