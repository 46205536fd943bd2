"""`python -m odsgd.launch --max-restarts N`: a job that failed is started again, whole.

Each attempt is a child `python -m odsgd.launch` with the same options less the ones of this
module (a fresh scheduler port, every process new); it writes how it ended into the file
named by ODSGD_ATTEMPT_REPORT, and this process decides whether to start the next one. The
single-attempt launcher (odsgd/cluster/launch.py) stays as it is; this module only starts it, reads
checkpoint folders (odsgd.common.checkpoint_index) and imports nothing of MXNet.
"""
import argparse
import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ..common.checkpoint_index import latest_checkpoint
from .parent_death import die_with_parent

LOG = logging.getLogger("odsgd.launch")

#: the attempt's number (0 for the first), set for every process of the job
RESTART_COUNT_VARIABLE = "ODSGD_RESTART_COUNT"
#: --checkpoint-dir as an absolute path, set for every process of the job
CHECKPOINT_DIR_VARIABLE = "ODSGD_CHECKPOINT_DIR"


def attempt_number(environ=None):
    """This process's attempt of a job under --max-restarts (ODSGD_RESTART_COUNT): 0 for the
    first, and where no launcher set it."""
    return int((os.environ if environ is None else environ).get(RESTART_COUNT_VARIABLE) or 0)


#: where an attempt's launcher writes its report (popped there: no process of the job gets it)
REPORT_VARIABLE = "ODSGD_ATTEMPT_REPORT"

#: How an attempt ended (Outcome.cause):
#:   finished          every process exited with code 0
#:   killed            a process was killed by a signal (or a shell/ssh said so: 128 + N)
#:   connection-lost   an ssh client exited with 255: its host or the connection went away
#:   timeout           the attempt ran past --job-timeout
#:   link-lost         the launcher's own host lost the job's link (LinkWatch)
#:   launcher-killed   the attempt's launcher was killed by a signal and wrote no report
#:   exit-code         a process exited with a non-zero code (an exception in the script)
#:   stalled           workers that never joined, or processes still running once the
#:                     scheduler finished
#:   launcher-error    the attempt's launcher stopped before or without running the job
#:                     (a bad option, an unreadable hostfile): it would stop again
#:   interrupted       Ctrl-C or SIGTERM to the launcher: never restarted
FAILURES = ("killed", "connection-lost", "timeout", "link-lost", "launcher-killed")
RESTART_ON = {"failure": FAILURES, "any": FAILURES + ("exit-code", "stalled")}


class Outcome(collections.namedtuple("Outcome", "code reason cause")):
    """How one attempt ended: its launcher's exit code, the reason in words (None when it
    finished), and the cause (one of the words above)."""


def exit_cause(returncode, over_ssh=False):
    """The cause of one process's non-zero exit: 'killed' for a signal (a negative code, or
    128 + N from a shell or an ssh client that ran the killed process), 'connection-lost' for
    an ssh client's 255, else 'exit-code'."""
    if returncode < 0:
        return "killed"
    if returncode == 255 and over_ssh:
        return "connection-lost"
    if returncode > 128 and signal_name(returncode - 128) is not None:
        return "killed"
    return "exit-code"


def signal_name(number):
    """'SIGKILL' for 9; None for a number that is no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def shell_code(code):
    """A Popen exit code as a shell gives it: 128 + N for a process killed by signal N (Popen's
    -N), which os._exit could not pass on."""
    return 128 - code if code < 0 else code


# -- options -------------------------------------------------------------------------------
def add_options(parser):
    """Adds --max-restarts, --restart-on and --checkpoint-dir (with their help) to an
    argparse parser."""
    parser.add_argument(
        "--max-restarts", type=_count, default=0, metavar="N",
        help="start the whole job again, up to N times, after an attempt failed (a process "
        "killed by a signal, an ssh connection lost, --job-timeout, this host's link lost): "
        "a fresh scheduler port, every process new, ODSGD_RESTART_COUNT=1, 2, ... for "
        "each (0 for the first). Ctrl-C or SIGTERM to the launcher never restarts. The exit "
        "code is the last attempt's. Default 0: one attempt")
    parser.add_argument(
        "--restart-on", choices=sorted(RESTART_ON), default="failure",
        help="'failure' (default): restart only after the failures above; 'any': also after "
        "a process exited with a non-zero code (e.g. an exception in the script, which "
        "usually fails again) or the job stalled")
    parser.add_argument(
        "--checkpoint-dir", default=None, metavar="DIR",
        help="the job's checkpoint folder, given to every process as ODSGD_CHECKPOINT_DIR "
        "(an absolute path) to resume from. The launcher reads its newest whole checkpoint "
        "(the one with a <prefix>.whole.json marker) before and after each attempt and "
        "gives up instead of restarting when a failed attempt made no new one. For ssh "
        "jobs, a folder that this host and the workers share")


def _count(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError("give a whole number >= 0, e.g. --max-restarts 3 "
                                         "(got %r)" % text)
    return value


class Settings(collections.namedtuple("Settings",
                                      "max_restarts restart_on checkpoint_dir")):
    """The restart options of one launch."""


# -- the decision --------------------------------------------------------------------------
def decide(outcome, settings, attempt, before=None, after=None):
    """(restart, words) after attempt `attempt` (0 for the first) ended with `outcome`;
    `before` and `after` are the newest whole checkpoints in --checkpoint-dir before and
    after it (Checkpoint or None)."""
    if outcome.code == 0:
        return False, "the job is done"
    if outcome.cause == "interrupted":
        return False, "stopped by Ctrl-C / SIGTERM to the launcher, never restarted"
    if outcome.cause not in RESTART_ON[settings.restart_on]:
        return False, _not_restarted(outcome.cause, settings.restart_on)
    if attempt >= settings.max_restarts:
        return False, "no restart left (--max-restarts %d)" % settings.max_restarts
    if settings.checkpoint_dir is not None and not made_progress(before, after):
        return False, ("giving up: the attempt made no new whole checkpoint in %s (%s)"
                       % (settings.checkpoint_dir, "the newest is still %s" % _named(before)
                          if after is not None else "there is none"))
    if settings.checkpoint_dir is None:
        return True, "restarting"
    return True, "restarting (resumes from %s)" % _named(after)


def _not_restarted(cause, restart_on):
    if cause == "launcher-error":
        return "not restarted: the launcher could not run the job (see its message above)"
    if restart_on == "any":   # not a cause either list knows: say so rather than guess
        return "not restarted: %s is not a cause to restart for" % cause
    return ("not restarted: a process exited with an error or the job stalled, which would "
            "happen again (--restart-on any restarts it too)")


def made_progress(before, after):
    """True when `after` is a whole checkpoint other than `before` (a prefix or step of its
    own): the attempt saved at least once."""
    if after is None:
        return False
    return before is None or (after.prefix, after.step) != (before.prefix, before.step)


def _named(checkpoint):
    return "%s, step %d" % (checkpoint.prefix, checkpoint.step)


def newest_checkpoint(directory):
    """latest_checkpoint(directory), or None without --checkpoint-dir."""
    return None if directory is None else latest_checkpoint(directory)


# -- one attempt ---------------------------------------------------------------------------
def write_report(path, outcome):
    """Writes `outcome` (an attempt's launcher does, at its end) as JSON to `path`."""
    with open(path + ".tmp", "w") as f:
        json.dump(outcome._asdict(), f)
    os.replace(path + ".tmp", path)


def read_report(path, returncode, pid):
    """The Outcome an attempt's launcher (`pid`, exit code `returncode`) wrote, or, where it
    wrote none, one made from its exit code."""
    try:
        with open(path) as f:
            return Outcome(**json.load(f))
    except (OSError, ValueError, TypeError):
        pass
    if returncode == 0:
        return Outcome(0, None, "finished")
    if returncode < 0:
        return Outcome(returncode, "the attempt's launcher (pid %d) was killed by signal %d"
                       % (pid, -returncode), "launcher-killed")
    return Outcome(returncode, "the launcher exited with code %d before its job ran"
                   % returncode, "launcher-error")


class Stop(object):
    """SIGINT and SIGTERM to this process: remembered, and passed once to the running
    attempt's launcher, which ends its job with its own exit code (130 / 1)."""

    CODES = {signal.SIGINT: 130, signal.SIGTERM: 1}

    def __init__(self):
        self.signum = None
        self.forwarded_to = None
        self._previous = {}

    def install(self):
        for signum in self.CODES:
            self._previous[signum] = signal.signal(signum, self._remember)

    def restore(self):
        """The handlers from before install() (run() is also called from Python)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _remember(self, signum, _frame):
        if self.signum is None:
            self.signum = signum

    def forward(self, child):
        """Passes the signal to `child` once (a second one could cut its job's ending
        short); polled by the attempt loop, so the handler itself never races a Popen."""
        if self.signum is not None and self.forwarded_to is not child:
            self.forwarded_to = child
            try:
                child.send_signal(self.signum)
            except ProcessLookupError:
                pass

    @property
    def code(self):
        return self.CODES.get(self.signum, 1)


def run_attempt(argv, attempt, settings, stop, report_path):
    """Runs one attempt, `python -m odsgd.launch ARGV` in a session of its own (Ctrl-C at a
    terminal reaches this process only, which passes it on once); returns its Outcome."""
    env = dict(os.environ)
    env[RESTART_COUNT_VARIABLE] = str(attempt)
    env[REPORT_VARIABLE] = report_path
    if settings.checkpoint_dir is not None:
        env[CHECKPOINT_DIR_VARIABLE] = os.path.abspath(settings.checkpoint_dir)
    if os.path.exists(report_path):
        os.unlink(report_path)
    child = subprocess.Popen([sys.executable, "-m", "odsgd.launch"] + list(argv), env=env,
                             start_new_session=True, preexec_fn=die_with_parent())
    LOG.info("odsgd.launch: attempt %d of %d started (pid %d, %s=%d)", attempt + 1,
             settings.max_restarts + 1, child.pid, RESTART_COUNT_VARIABLE, attempt)
    while child.poll() is None:
        stop.forward(child)
        time.sleep(0.1)
    return read_report(report_path, child.returncode, child.pid)


def run(argv, settings):
    """The attempts of one job, `argv` being odsgd.launch's arguments less the restart
    options; the exit code of the last one (130 / 1 where Ctrl-C / SIGTERM came between
    two)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    folder = tempfile.mkdtemp(prefix="odsgd-attempts-")
    stop = Stop()
    stop.install()
    try:
        for attempt in range(settings.max_restarts + 1):
            if stop.signum is not None:
                LOG.error("odsgd.launch: signal %d to the launcher between two attempts; "
                          "not restarted", stop.signum)
                return stop.code
            before = newest_checkpoint(settings.checkpoint_dir)
            outcome = run_attempt(argv, attempt, settings, stop,
                                  os.path.join(folder, "attempt.json"))
            if stop.signum is not None and outcome.code != 0:
                outcome = outcome._replace(cause="interrupted")
            restart, words = decide(outcome, settings, attempt, before,
                                    newest_checkpoint(settings.checkpoint_dir))
            (LOG.info if outcome.code == 0 else LOG.error)(
                "odsgd.launch: attempt %d of %d ended: %s; %s", attempt + 1,
                settings.max_restarts + 1, outcome.reason or "exit code 0", words)
            if not restart:
                # interrupted: the launcher's own code, 130 / 1, even where the signal reached
                # the attempt's launcher before its handlers (killed by it, or a traceback)
                return stop.code if outcome.cause == "interrupted" else shell_code(outcome.code)
        return shell_code(outcome.code)   # not reached: decide() stops at --max-restarts
    finally:
        stop.restore()
        shutil.rmtree(folder, ignore_errors=True)
