"""A job ends whole, however it was started: every worker tells the rest of the job how it
ends, and the job's other processes end with it (docs/reliability.md, "Jobs started without
odsgd.launch").

Each dist_odsgd worker listens on a TCP port of its own (`Announcer`); the other workers, the
servers and (where it runs MXNet's own scheduler, a job started without odsgd.launch) the
scheduler connect to it and keep the connection open (`Watch`). The worker writes one line
on those connections when it ends: `finished` (its exit check passed, odsgd/worker/agreement.py)
or `failed` with why (a failed step, an uncaught exception, a refusal, a failed exit check).
A connection that closes without a line, or one refused, means the worker's process ended
without a word (SIGKILL, a crash); a worker that cannot be reached at all (a firewall that
admits ps-lite's ports only) is not watched from there, with a line that says so. A worker that is slow but alive keeps its connection
and ends nothing.

* a worker that learns of another worker's failure ends, exit code 1, after a grace of a few
  seconds (at most ODSGD_EXIT_WAIT), naming the rank and why;
* a server or scheduler ends when every worker has ended: exit code 1 when one of them did
  not finish; when they all finished, ps-lite ends it, or it ends with code 0 after
  ODSGD_EXIT_WAIT.

The workers learn each other's address through the servers (the store's gather); rank 0 tells
the servers in a command (odsgd/server/updater.py, `watch_workers_command`) and the scheduler
in a UDP datagram to the scheduler's address and port (`tell_scheduler`; ps-lite's own socket
there is TCP). Each line, and the datagram, carries the sender's token, a random number it
published with its address, and where the job has a key a MAC under it (odsgd/common/job_key.py).

Imports nothing of MXNet: servers and schedulers run it inside `import mxnet`.
"""
import hmac
import json
import os
import random
import socket
import sys
import threading
import time

from . import job_key
from .config import exit_wait_seconds

#: seconds a worker that learned of another's failure waits before it ends (at most
#: ODSGD_EXIT_WAIT): the failed worker, whose own error says most, ends first where it can
GRACE_SECONDS = 5.0
#: seconds a watcher tries to reach a worker before it counts it as ended
CONNECT_SECONDS = 10.0
FINISHED, FAILED = "finished", "failed"


def local_address(environ=None):
    """The IPv4 address others reach this worker at: DMLC_NODE_HOST where the launcher sets it
    (odsgd.launch and dmlc_tracker's ssh launcher do), else the one this host reaches the
    scheduler from."""
    environ = os.environ if environ is None else environ
    host = environ.get("DMLC_NODE_HOST") or ""
    if not host:
        scheduler = environ.get("DMLC_PS_ROOT_URI", "127.0.0.1")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(scheduler), 9))   # sends nothing
            host = probe.getsockname()[0]
    return socket.gethostbyname(host)


def new_token():
    """48 random bits as two numbers below 2**24 (exact through the servers' float32)."""
    draw = random.SystemRandom()
    return [float(draw.getrandbits(24)), float(draw.getrandbits(24))]


def _mac(kind, payload):
    key = job_key.job_key()
    if key is None:
        return None
    return job_key.mac(key, kind, job_key.job_context(), json.dumps(payload, sort_keys=True))


def _signed(kind, payload):
    return dict(payload, mac=_mac(kind, payload))


def _authentic(kind, message, token=None):
    """Whether `message` (a dict) carries `token` (when given) and the job's MAC."""
    if not isinstance(message, dict):
        return False
    payload = {k: v for k, v in message.items() if k != "mac"}
    if token is not None and payload.get("token") != token:
        return False
    expected, given = _mac(kind, payload), message.get("mac")
    if expected is None:
        return True
    return isinstance(given, str) and hmac.compare_digest(expected, given)


class Announcer(object):
    """A worker's side: its listener, and the line it writes to every watcher when it ends."""

    def __init__(self, rank):
        self.rank, self.token = rank, new_token()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((local_address(), 0))
        self._server.listen(128)
        self.address, self.port = self._server.getsockname()
        self._lock = threading.Lock()
        self._watchers = []
        self._last = None    # the line written at the end, for a watcher that comes late
        threading.Thread(target=self._accept, name="odsgd job watch", daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            connection.settimeout(2.0)
            with self._lock:
                self._watchers.append(connection)
                last = self._last
            if last is not None:
                _send_quietly(connection, last)

    def announce(self, end, error="", step=None):
        """Tells every watcher how this worker ends (FINISHED or FAILED, why, the step that
        failed); the first announcement counts."""
        payload = {"rank": self.rank, "end": end, "error": str(error)[:2000],
                   "step": step, "token": self.token}
        line = (json.dumps(_signed(b"end", payload)) + "\n").encode("utf-8")
        with self._lock:
            if self._last is not None:
                return
            self._last = line
            watchers = list(self._watchers)
        for connection in watchers:
            _send_quietly(connection, line)


def _send_quietly(connection, line):
    try:
        connection.sendall(line)
    except OSError:
        pass   # that watcher is gone


def _connect(host, port):
    """A connection to a worker's listener; None where the worker is gone (the connection is
    refused: its host answers, nothing listens), False where it cannot be reached within
    CONNECT_SECONDS (a firewall, a lost route: not a sign that it ended)."""
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=5.0)
        except ConnectionRefusedError:
            return None
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


class Watch(object):
    """Watches the workers `peers`, {rank: (host, port, token)}: `on_failure(rank, message)`
    once per worker that ends without finishing (message: its line, or None where it ended
    without a word); `on_all_ended(failed ranks)` once every watched worker has ended."""

    def __init__(self, peers, on_failure, on_all_ended=None):
        self.peers = {int(r): tuple(p) for r, p in peers.items()}
        self.on_failure, self.on_all_ended = on_failure, on_all_ended
        self.lock = threading.Lock()
        self.ended, self.failed = set(), {}
        for rank in sorted(self.peers):
            threading.Thread(target=self._watch, args=(rank,), daemon=True,
                             name="odsgd watch of worker %d" % rank).start()

    def _watch(self, rank):
        host, port, token = self.peers[rank]
        outcome = None
        connection = _connect(host, port)
        if connection is False:
            sys.stderr.write("odsgd: cannot reach worker %d at %s:%s (a firewall?): it is not "
                             "watched from this process\n" % (rank, host, port))
            return   # unknown: neither ended nor watched
        if connection is not None:
            connection.settimeout(None)
            with connection, connection.makefile("r", encoding="utf-8") as lines:
                try:
                    for line in lines:
                        try:
                            message = json.loads(line)
                        except ValueError:
                            continue
                        if _authentic(b"end", message, token) and message.get("rank") == rank:
                            outcome = message
                            if message.get("end") == FAILED:
                                self._failure(rank, message)
                except (OSError, ValueError):   # a reset, bytes that are no text
                    pass
        if outcome is None or outcome.get("end") not in (FINISHED, FAILED):
            self._failure(rank, None)
        self._ended(rank)

    def _failure(self, rank, message):
        with self.lock:
            if rank in self.failed:
                return
            self.failed[rank] = message
        self.on_failure(rank, message)

    def _ended(self, rank):
        with self.lock:
            self.ended.add(rank)
            done = len(self.ended) == len(self.peers)
            failed = dict(self.failed)
        if done and self.on_all_ended is not None:
            self.on_all_ended(failed)


def describe(rank, message):
    """'worker 1 failed: RuntimeError: ...' / '... ended without a word (...)'."""
    if message is None:
        return ("worker %d ended without finishing and without a word (killed by a signal, "
                "crashed, or exited before its exit check)" % rank)
    if message.get("step") is not None:
        return "worker %d's step %d failed (%s)" % (rank, message["step"], message["error"])
    return "worker %d ended without finishing (%s)" % (rank, message["error"])


def end_process(code, text):
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)


_WATCHING = []


def watch_job(peers, label):
    """On a server or the scheduler (`label`, e.g. 'server 0'): ends this process once every
    worker of `peers` has ended (see the module's docstring). Once per process."""
    if _WATCHING:
        return
    wait = exit_wait_seconds()

    def on_failure(rank, message):
        sys.stderr.write("odsgd %s: %s\n" % (label, describe(rank, message)))
        sys.stderr.flush()
        # a worker that cannot end (stuck in the kernel) must not keep the rest forever
        timer = threading.Timer(wait + GRACE_SECONDS, end_process, (
            1, "odsgd %s: a worker failed %g s ago and not every worker has ended; this %s "
               "ends (exit code 1)" % (label, wait + GRACE_SECONDS, label)))
        timer.daemon = True
        timer.start()

    def on_all_ended(failed):
        if failed:
            end_process(1, "odsgd %s: every worker has ended, %d without finishing (%s); "
                            "the job is over and this %s ends (exit code 1)"
                         % (label, len(failed), ", ".join("worker %d" % r for r in sorted(failed)),
                            label))
        # every worker finished: ps-lite's finalize ends this process; if it does not
        timer = threading.Timer(wait, end_process, (0, "odsgd %s: every worker finished %g s "
                                                       "ago; this %s ends" % (label, wait, label)))
        timer.daemon = True
        timer.start()
    _WATCHING.append(Watch(peers, on_failure, on_all_ended))


def _table_text(peers):
    return {str(r): [h, int(p), list(t)] for r, (h, p, t) in peers.items()}


def tell_scheduler(peers, environ=None, seconds=5.0):
    """From rank 0: sends the scheduler the workers' table in a UDP datagram to
    DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT until it answers (a scheduler of a job started without
    odsgd.launch, `serve_scheduler`) or `seconds` pass; in a daemon thread. odsgd.launch's
    scheduler does not listen there (the launcher ends its jobs): nothing answers."""
    environ = os.environ if environ is None else environ

    def send():
        try:
            address = (socket.gethostbyname(environ["DMLC_PS_ROOT_URI"]),
                       int(environ["DMLC_PS_ROOT_PORT"]))
            datagram = json.dumps(_signed(b"watch", {"peers": _table_text(peers)})).encode()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.connect(address)
                udp.settimeout(0.5)
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    udp.send(datagram)
                    try:
                        if udp.recv(64) == b"ok":
                            return
                    except socket.timeout:
                        continue
        except (OSError, KeyError, ValueError):
            return   # nothing listens there (ICMP refused), or no scheduler address
    threading.Thread(target=send, name="odsgd tell the scheduler", daemon=True).start()


def serve_scheduler(environ=None):
    """On a scheduler started by hand (MXNet's server loop, through the start-up hook): waits
    for rank 0's table of workers (`tell_scheduler`), then watches them (`watch_job`)."""
    environ = os.environ if environ is None else environ
    try:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((socket.gethostbyname(environ.get("DMLC_PS_ROOT_URI", "127.0.0.1")),
                  int(environ.get("DMLC_PS_ROOT_PORT", "0"))))
    except (OSError, ValueError):
        return

    def serve():
        while not _WATCHING:
            try:
                datagram, sender = udp.recvfrom(65536)
                message = json.loads(datagram)
            except (OSError, ValueError):
                continue
            if _authentic(b"watch", message) and isinstance(message.get("peers"), dict):
                udp.sendto(b"ok", sender)
                watch_job({int(r): tuple(p) for r, p in message["peers"].items()},
                          "scheduler")
        udp.close()
    threading.Thread(target=serve, name="odsgd scheduler watch", daemon=True).start()
