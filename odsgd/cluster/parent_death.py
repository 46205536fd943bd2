"""Children that die with the process that started them (Linux): the launcher's job, and the
attempts of a launcher that restarts its job, never outlive it, even when it is killed with
SIGKILL."""
import ctypes
import os
import signal
import sys

#: prctl's option that has the kernel send a signal to the caller when its parent dies
PR_SET_PDEATHSIG = 1


def die_with_parent():
    """preexec_fn for subprocess.Popen that asks Linux to SIGKILL the child when this process
    dies, or None where that cannot be asked (another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        # Only a system call here: this runs in the forked child of a threaded process.
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:   # the parent died before prctl took effect
            os._exit(1)
    return preexec
