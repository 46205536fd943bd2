"""The cases of the fault sweep (`python -m odsgd.bench faults`): which fault at which point,
under which restart options, and what each must end with.

A case's fault strikes either in the job's first attempt (FIRST_POINTS) or in the attempt
that the launcher restarted after a first fault, a worker killed with a step's rounds in
flight (RESTART_POINTS: a second fault). Imports nothing: the sweep's job
(odsgd/bench/fault_sweep_job.py) takes its points, inside faults and run name from here.
"""
import collections

#: faults from outside the job (the sweep makes them) and from inside (the job makes them)
OUTSIDE_FAULTS = ("worker killed", "server killed", "scheduler killed", "link down", "ctrl-c")
INSIDE_FAULTS = ("hang", "value-error")
FAULTS = OUTSIDE_FAULTS + INSIDE_FAULTS
#: points of the first attempt, and of the restarted attempt (odsgd/bench/fault_sweep_job.py)
FIRST_POINTS = ("before-push", "in-flight", "save")
RESTART_POINTS = ("up", "load", "first-step")
POINTS = FIRST_POINTS + RESTART_POINTS
POINT_NAMES = {"before-push": "before the push", "in-flight": "rounds in flight",
               "save": "during a save", "up": "restart: workers up, before the load",
               "load": "restart: during the load",
               "first-step": "restart: first step after it"}
#: the job's step_prefix name (its checkpoints)
RUN_NAME = "fault-job"
#: the first fault of a case whose point is in the restarted attempt
FIRST_FAULT = ("worker killed", "in-flight")

#: What a case must end with (the launcher's exit code and its decision on the attempt the
#: case's fault ended):
#:   restarted      the job restarted and finished: exit 0, equal to the uninterrupted run
#:   interrupted    Ctrl-C: exit 130, never restarted
#:   not restarted  the script's own error (a ValueError): exit 1, not restarted
#:   gives up       the attempt made no new whole checkpoint (--checkpoint-dir): non-zero exit
EXPECTED = {"ctrl-c": "interrupted", "value-error": "not restarted"}
#: the launcher's words (odsgd/cluster/restarts.py decide) that each expectation needs
DECISION_WORDS = {"restarted": "restarting", "interrupted": "stopped by Ctrl-C",
                  "not restarted": "not restarted", "gives up": "giving up: the attempt "
                  "made no new whole checkpoint"}


class Case(collections.namedtuple("Case", "fault point checkpoint_dir max_restarts expected")):
    """One row of the sweep: `fault` at `point`; `checkpoint_dir`: whether the launcher gets
    --checkpoint-dir (and so gives up after an attempt that saved nothing new);
    `max_restarts`: --max-restarts; `expected`: one of EXPECTED's values or 'restarted'."""

    @property
    def attempt(self):
        """The attempt (ODSGD_RESTART_COUNT) the case's own fault strikes in."""
        return 0 if self.point in FIRST_POINTS else 1

    @property
    def first_fault(self):
        """(fault, point) struck in attempt 0 before the case's own, or None."""
        return FIRST_FAULT if self.attempt == 1 else None

    @property
    def restarts_expected(self):
        """The restarts the launcher must have made by its exit."""
        return self.attempt + (1 if self.expected == "restarted" else 0)

    @property
    def name(self):
        return "%s_%s%s" % (self.fault.replace(" ", "_"), self.point,
                            "_gives_up" if self.expected == "gives up" else "")

    def row(self, **measured):
        """The case's row of the sweep (odsgd/bench/fault_report.py): its fields, `case`
        (the case's name unless `measured` gives its folder), the attempt its fault strikes
        in and the restarts expected, with `measured` over them."""
        row = dict(self._asdict(), case=self.name, attempt=self.attempt,
                   restarts_expected=self.restarts_expected)
        row.update(measured)
        return row


def case(fault, point):
    """The case of `fault` at `point`. First-attempt cases run with --checkpoint-dir: the
    attempt saved whole checkpoints before the fault, so the launcher restarts. Cases of the
    restarted attempt run without it: their second fault comes before that attempt saved
    anything, after which the launcher would give up (the case give_up_case shows)."""
    if fault not in FAULTS or point not in POINTS:
        raise ValueError("unknown fault %r or point %r: faults %s; points %s"
                         % (fault, point, ", ".join(FAULTS), ", ".join(POINTS)))
    first = point in FIRST_POINTS
    return Case(fault, point, checkpoint_dir=first, max_restarts=1 if first else 2,
                expected=EXPECTED.get(fault, "restarted"))


def give_up_case():
    """Repeated faults without progress: a worker killed in the first attempt (which saved)
    and again at the restarted attempt's first step (before it saved anything new), with
    --checkpoint-dir and restarts left: the launcher gives up."""
    return Case("worker killed", "first-step", checkpoint_dir=True, max_restarts=2,
                expected="gives up")


def plan(faults=FAULTS, points=POINTS, give_up=True):
    """The sweep's cases: every fault at every point (points first), then give_up_case."""
    cases = [case(fault, point) for point in points for fault in faults]
    return cases + ([give_up_case()] if give_up else [])
