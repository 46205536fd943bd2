"""A step that fails part way leaves a store that says so: `FailedStep`.

A step sends one round per key group (odsgd/worker/exchange.py) and the servers merge each key's
pushes by count, not by step. When a step raises after some of its rounds were sent (a local
update that fails, a gather, Ctrl-C) and the caller catches the exception and goes on, the
groups after the failure were never sent for that step: from then on this worker's rounds of
step s meet the other workers' rounds of step s - 1, and nothing would ever notice (the
collective step checks count calls, not rounds). So the first such failure is recorded and
every later call of the store raises `StoreFailedError` naming it; a save refuses instead of
hanging or writing states that do not match the servers', and the worker ends with exit code
1 at exit (odsgd/worker/agreement.py) so that the launcher ends the job.

A call that is refused before it changes anything (a missing optimizer, a sparse array, keys
never initialised) is not a failure of the store: its error is raised and the store goes on.
"""
import contextlib


class StoreFailedError(RuntimeError):
    """A dist_odsgd store whose step failed part way is used again."""


class FailedStep(object):
    """The first step of a store that failed after it began to change the store's state.
    `on_failure(step, error text)`, when set, is called once, at that failure (the store
    tells the other workers: odsgd/worker/failure_alarm.py)."""

    def __init__(self):
        self.step = None
        self.error = None
        self.sent = None     # (key groups whose round of the step was sent, groups in the step)
        self.on_failure = None

    @property
    def failed(self):
        return self.error is not None

    @contextlib.contextmanager
    def guard(self, step, groups):
        """Records an exception that leaves the block: the block changes the store's state
        (sends step `step`'s rounds). `groups()`: the key groups of the step, asked at the
        failure (the step's plan may fuse the groups it was called with)."""
        try:
            yield
        except BaseException as error:
            if not self.failed:
                self.step = step
                self.error = "%s: %s" % (type(error).__name__, error)
                step_groups = groups()
                self.sent = (sum(1 for g in step_groups if g.server_step == step + 1),
                             len(step_groups))
                if self.on_failure is not None:
                    self.on_failure(step, self.error)
            raise

    def describe(self):
        return ("dist_odsgd: step %d failed on this worker (%s) after %d of its %d key groups "
                "had sent their rounds; the servers would sum this worker's later rounds with "
                "the other workers' rounds of other steps, so the store takes no more calls. "
                "End the job (an uncaught exception does it: odsgd.launch then ends the other "
                "processes) and resume from the last checkpoint (odsgd.load_checkpoint)"
                % (self.step, self.error, self.sent[0], self.sent[1]))

    def check(self, what):
        """Raises StoreFailedError when a step failed: `what` (e.g. 'pushpull') is refused."""
        if self.failed:
            raise StoreFailedError("%s refused. %s" % (what, self.describe()))
