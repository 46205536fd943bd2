"""The worker process and its job: the DMLC_* environment a worker needs, a scheduler that
answers, and an uncaught exception that ends the worker instead of hanging the job."""
import os
import sys

from . import failure_alarm

REQUIRED_ENVIRONMENT = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                        "DMLC_NUM_SERVER", "DMLC_NUM_WORKER")
#: seconds a worker waits for the scheduler at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT to listen,
#: and for what listens there to greet as a ZeroMQ peer does at once
SCHEDULER_WAIT_SECONDS = 120.0
SCHEDULER_GREETING_SECONDS = 5.0
# What a ZeroMQ peer (ps-lite's scheduler) sends first on a new connection (ZMTP signature).
_ZMTP_SIGNATURE_START = b"\xff"


def check_environment(environ=None, probe_scheduler=True):
    """Raises ValueError naming the launcher when a DMLC_* variable a worker needs is missing
    or malformed, or when no ps-lite scheduler answers at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT
    within SCHEDULER_WAIT_SECONDS (ps-lite would abort or wait forever instead)."""
    environ = os.environ if environ is None else environ
    missing = [name for name in REQUIRED_ENVIRONMENT if not environ.get(name)]
    if missing:
        raise ValueError(
            "dist_odsgd needs a parameter-server job, but %s %s not set. Start the job with "
            "`python -m odsgd.launch -n WORKERS -s SERVERS --launcher local python "
            "train.py ...` (or set the DMLC_* variables by hand)"
            % (", ".join(missing), "is" if len(missing) == 1 else "are"))
    if environ["DMLC_ROLE"] != "worker":
        raise ValueError("dist_odsgd is created on workers only, but DMLC_ROLE=%r"
                         % environ["DMLC_ROLE"])
    for name in ("DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        try:
            value = int(environ[name])
        except ValueError:
            value = -1
        if value < 1 or (name == "DMLC_PS_ROOT_PORT" and value > 65535):
            raise ValueError("%s=%r must be a positive integer%s" % (
                name, environ[name], " (a TCP port, 1-65535)" if name == "DMLC_PS_ROOT_PORT"
                else ""))
    if probe_scheduler:
        _check_scheduler(environ["DMLC_PS_ROOT_URI"], int(environ["DMLC_PS_ROOT_PORT"]),
                         SCHEDULER_WAIT_SECONDS)


def num_servers(environ=None):
    """The job's number of servers (DMLC_NUM_SERVER; 0 where unset)."""
    environ = os.environ if environ is None else environ
    return int(environ.get("DMLC_NUM_SERVER", "0") or 0)


def _check_scheduler(host, port, wait):
    """Connects to the scheduler's port once, as ps-lite will: ValueError when the host does
    not resolve, when nothing listens there for `wait` seconds, or when what listens is not a
    ZeroMQ peer (another program holds the port). ps-lite itself would wait forever."""
    import socket
    import time
    where = "DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT = %s:%d" % (host, port)
    try:
        socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError("%s: the host does not resolve (%s)" % (where, error)) from None
    deadline = time.time() + wait
    while True:
        try:
            with socket.create_connection((host, port), timeout=5) as connection:
                connection.settimeout(SCHEDULER_GREETING_SECONDS)
                try:
                    first = connection.recv(1)
                except socket.timeout:
                    first = b""
            if first == _ZMTP_SIGNATURE_START:
                return
            raise ValueError("%s: what listens there is not a ps-lite scheduler (another "
                             "program holds the port?); start the job with `python -m "
                             "odsgd.launch`, which picks a free port" % where)
        except OSError as error:   # refused, unreachable, timed out: not listening yet
            if time.time() > deadline:
                raise ValueError("%s: no scheduler listens there after %.0f s (%s); check the "
                                 "address, or start the job with `python -m odsgd.launch`"
                                 % (where, wait, error)) from None
            time.sleep(0.5)


def exit_on_uncaught_exception():
    """Makes an uncaught exception end this worker at once with exit code 1.

    Otherwise MXNet's dist store, destroyed at exit, waits in ps-lite's finalize barrier for
    the other workers, which wait for this one: the job hangs (apache/mxnet#9611) instead of
    failing, and the launcher never learns of it."""
    previous = sys.excepthook
    if getattr(previous, "odsgd_fail_fast", False):
        return

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        # the other workers, the servers and the scheduler end too (failure_alarm.py)
        failure_alarm.announce_failure("%s: %s" % (kind.__name__, value))
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    hook.odsgd_fail_fast = True
    sys.excepthook = hook
