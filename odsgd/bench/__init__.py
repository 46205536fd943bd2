"""Benchmarks and studies: `python -m odsgd.bench SUBCOMMAND [options]` (or `odsgd-bench`).

Subcommands are modules of this package with a `main(argv)`; importing this package imports
none of them (their jobs also run on parameter servers, where little may be imported)."""
import importlib
import signal
import sys

#: name -> one line for --help (importing the modules for their docstrings would import
#: MXNet); subcommand NAME is the module odsgd.bench.NAME, "-" written "_" (module_of)
SUBCOMMANDS = {
    "throughput": "SSGD vs ASGD vs OD-SGD on a shaped network",
    "convergence": "accuracy per mode and seed",
    "time-to-accuracy": "accuracy against time, real images",
    "timeline": "a few steps per worker, per mode, drawn",
    "plan": "the step model's predictions; runs no job",
    "rounds": "answers' spread across workers, from timelines",
    "faults": "the fault sweep of docs/reliability.md",
    "goodput": "TCP payload through a shaped emulated NIC",
    "replan": "recorded runs' predictions, model changed",
}


def module_of(name):
    """The module of subcommand `name`."""
    return "odsgd.bench." + name.replace("-", "_")


def usage():
    """The list of subcommands, one line each."""
    width = max(len(name) for name in SUBCOMMANDS)
    return "\n".join(["usage: python -m odsgd.bench SUBCOMMAND [options]   (or odsgd-bench; "
                      "SUBCOMMAND --help for its options)", "", "subcommands:"] +
                     ["  %-*s  %s" % (width, name, summary)
                      for name, summary in SUBCOMMANDS.items()])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if not argv or argv[0] not in SUBCOMMANDS:
        print(usage(), file=sys.stderr)
        print("\nodsgd.bench: %s" % ("give a subcommand" if not argv else
                                     "unknown subcommand %r" % argv[0]), file=sys.stderr)
        return 2
    # SIGTERM ends a benchmark as Ctrl-C does: the running job is ended with it (run_job's
    # handler), instead of the benchmark dying alone and leaving its job behind.
    signal.signal(signal.SIGTERM, _interrupt)
    module = importlib.import_module(module_of(argv[0]))
    try:
        return module.main(argv[1:])
    except KeyboardInterrupt as stop:
        print("odsgd.bench %s: interrupted (%s); its running job was ended"
              % (argv[0], stop or "Ctrl-C"), file=sys.stderr)
        return 130


def _interrupt(signum, _frame):
    raise KeyboardInterrupt("signal %d" % signum)
