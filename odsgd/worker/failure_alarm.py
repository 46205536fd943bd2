"""A worker whose step failed tells the other workers, which end instead of waiting forever.

After a step failed part way on one worker (odsgd/worker/failed_step.py), the other workers wait in
that step's rounds for pushes that never come: the servers merge by count. `odsgd.launch` ends
them when the failed worker exits, but a job started another way (MXNet's own tools/launch.py,
a cluster manager, DMLC_* set by hand) has nothing that does: the job hangs.

So every worker listens on a TCP port of its own from the moment its store is made, and the
workers learn each other's address then (one collective gather through the servers). A worker
whose step fails sends every other worker one line naming its rank, the step and the error;
a worker that receives it writes the reason to stderr and ends with exit code 1, whatever it is
blocked in, after a grace of a few seconds (ALARM_GRACE_SECONDS, at most ODSGD_EXIT_WAIT): the
failed worker, whose own error says most, ends first where it can, and a launcher that ends
the job when a process fails names it. A line must carry the sender's token, a random number it published with its
address, and where the job has a key (odsgd/common/job_key.py) a MAC under it, so that nothing
but a worker of the same job can end one (the token travels through the servers in clear).

The address is DMLC_NODE_HOST where the launcher sets it (odsgd.launch and dmlc_tracker's ssh
launcher do), else the one this host reaches the scheduler from.
"""
import hmac
import json
import os
import random
import socket
import sys
import threading
import time

from ..common import job_key
from ..common.config import exit_wait_seconds

#: seconds a worker whose step failed spends on its alarm, reaching every other worker at once
SEND_SECONDS = 5.0
#: seconds a worker that got an alarm waits before it ends (at most ODSGD_EXIT_WAIT)
ALARM_GRACE_SECONDS = 5.0


def local_address(environ=None):
    """The IPv4 address other workers reach this one at (see the module's docstring)."""
    environ = os.environ if environ is None else environ
    host = environ.get("DMLC_NODE_HOST") or ""
    if not host:
        scheduler = environ.get("DMLC_PS_ROOT_URI", "127.0.0.1")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(scheduler), 9))   # sends nothing
            host = probe.getsockname()[0]
    return socket.gethostbyname(host)


def _address_numbers(address):
    """The 4 bytes of an IPv4 address: the servers keep a gathered row as float32, exact for
    integers below 2**24 only."""
    return [float(b) for b in socket.inet_aton(address)]


def _numbers_address(numbers):
    return socket.inet_ntoa(bytes(int(n) for n in numbers))


class FailureAlarm(object):
    """This worker's listener and the other workers' addresses.

    `gather(row)`: the collective all-gather of the store (WorkerAgreement.gather), which
    returns every worker's float64 row as a table (one row per rank)."""

    def __init__(self, gather, rank):
        self.rank = rank
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((local_address(), 0))
        self._server.listen(16)
        address, port = self._server.getsockname()
        # 48 random bits, as two numbers below 2**24 (exact through the servers' float32)
        draw = random.SystemRandom()
        self.token = [float(draw.getrandbits(24)), float(draw.getrandbits(24))]
        table = gather(_address_numbers(address) + [port] + self.token)
        self.peers = {r: (_numbers_address(row[:4]), int(row[4]), [float(t) for t in row[5:7]])
                      for r, row in enumerate(table) if r != rank}
        self._tokens = {r: peer[2] for r, peer in self.peers.items()}
        threading.Thread(target=self._listen, name="odsgd failure alarm",
                         daemon=True).start()

    def raise_alarm(self, step, error):
        """Tells every other worker that this worker's step `step` failed with `error` (a
        text); best effort, SEND_SECONDS in all at most. It runs inside the failing step's
        error handling: the workers are reached at once, each from a daemon thread of its own,
        so that unreachable ones delay this worker's own error by SEND_SECONDS, not by
        SEND_SECONDS each (a thread still connecting then is left behind)."""
        message = {"rank": self.rank, "step": int(step), "error": str(error),
                   "token": self.token}
        message["mac"] = _alarm_mac(message)
        line = (json.dumps(message) + "\n").encode("utf-8")
        deadline = time.monotonic() + SEND_SECONDS
        senders = [threading.Thread(target=_send, args=(host, port, line, SEND_SECONDS),
                                    name="odsgd failure alarm to rank %d" % rank, daemon=True)
                   for rank, (host, port, _token) in sorted(self.peers.items())]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(max(0.0, deadline - time.monotonic()))

    def _listen(self):
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(SEND_SECONDS)
                try:
                    message = json.loads(connection.makefile("r", encoding="utf-8").readline())
                except (OSError, ValueError):
                    continue
            if isinstance(message, dict) and \
                    self._tokens.get(message.get("rank")) == message.get("token") and \
                    _mac_matches(message):
                self._end(message)

    def _end(self, message):
        time.sleep(min(ALARM_GRACE_SECONDS, exit_wait_seconds()))
        sys.stderr.write(
            "dist_odsgd: worker %d's step %d failed (%s); the servers will never have its "
            "rounds of that step, so worker %d ends too. Resume the job from the last whole "
            "checkpoint (odsgd.resume_or_start)\n"
            % (message["rank"], message["step"], message["error"], self.rank))
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


def _alarm_mac(message):
    """The MAC of an alarm under the job's key (None where the job has none)."""
    key = job_key.job_key()
    if key is None:
        return None
    return job_key.mac(key, b"alarm", job_key.job_context(), message.get("rank"),
                       message.get("step"), message.get("error"),
                       json.dumps(message.get("token")))


def _mac_matches(message):
    expected, given = _alarm_mac(message), message.get("mac")
    if expected is None:
        return True
    return isinstance(given, str) and hmac.compare_digest(expected, given)


def _send(host, port, line, timeout):
    """Sends `line` (bytes) to the worker listening at host:port; nothing if it is gone."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as peer:
            peer.sendall(line)
    except OSError:
        pass   # that worker is gone already
