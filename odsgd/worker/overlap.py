"""`OverlapMeter`: how well dist_odsgd's communication hides behind computation, measured by
the store itself every ODSGD_METRICS_INTERVAL steps (config.metrics_interval)."""
import logging
import time

LOG = logging.getLogger("odsgd")


class OverlapMeter(object):
    """How well the pull of step t-1 hides behind step t's computation.

    Every `interval` global steps (0: never) the store blocks, before each key's local update,
    until W_t has arrived, and adds that wait to the step's total. A wait near 0 means the
    communication was hidden entirely; the benchmark compares it with the measured
    communication time. Sampling only every `interval` steps keeps the cost of blocking (it
    delays queueing the next keys' pushes) off the other steps.

    `summary()`: {'sampled_steps', 'mean_wait_s', 'max_wait_s', 'mean_step_s'}.
    """

    def __init__(self, interval):
        self.interval = interval
        self.waits = {}          # step -> seconds waited, summed over keys
        self._last_step = None
        self._step_times = []    # seconds between consecutive sampled-step starts

    def measure_wait(self, key, step, grad, global_weight):
        if not self.interval or step % self.interval:
            return
        # Python runs ahead of MXNet's engine: first let the engine reach this step's
        # gradient (untimed; the caller's gradient array, not the send buffer, whose copy
        # itself waits for the previous pull), then time only what is left of the wait.
        grad.wait_to_read()
        tic = time.time()
        global_weight.wait_to_read()
        wait = time.time() - tic
        if step not in self.waits:
            if self._last_step is not None:
                self._step_times.append((tic - self._last_step[1]) / (step - self._last_step[0]))
            self._last_step = (step, tic)
            if self.waits:
                LOG.info("odsgd overlap: step %d waited %.2f ms for the previous pull",
                         max(self.waits), 1e3 * self.waits[max(self.waits)])
        self.waits[step] = self.waits.get(step, 0.0) + wait

    def summary(self):
        waits = list(self.waits.values())
        return {"sampled_steps": len(waits),
                "mean_wait_s": sum(waits) / len(waits) if waits else None,
                "max_wait_s": max(waits) if waits else None,
                "mean_step_s": (sum(self._step_times) / len(self._step_times)
                                if self._step_times else None)}
