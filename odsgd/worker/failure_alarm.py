"""A worker that ends without finishing tells the rest of the job, which ends instead of
waiting forever (odsgd/common/job_watch.py holds the mechanism).

After a step failed part way on one worker (odsgd/worker/failed_step.py), after an uncaught
exception anywhere in a worker's script (between steps too: a data loader's error, a bug), a
refusal, or a SIGKILL, the other workers would wait in their next round for pushes that never
come, and the servers and the scheduler for workers that never finish. `odsgd.launch` ends
such a job, but a job started another way (MXNet's own tools/launch.py, a cluster manager,
DMLC_* set by hand) had nothing that did. So from the moment its store is made every worker
listens on a TCP port of its own, the workers learn each other's address (one collective
gather through the servers), each watches the others, and rank 0 has the servers and the
scheduler watch them too. How a worker ends goes to every watcher: the workers end, exit code
1, naming the rank and why; the servers and the scheduler end when every worker has.
"""
import socket
import threading

from ..common import job_watch
from ..common.config import exit_wait_seconds
from ..server import updater as servers

_ANNOUNCERS = []


def announce_failure(reason, step=None):
    """Tells the job that this worker ends without finishing, `reason` (text); nothing where
    its store has no alarm yet (a worker that never made a store takes no part in the job)."""
    for announcer in _ANNOUNCERS:
        announcer.announce(job_watch.FAILED, reason, step)


def _address_numbers(address):
    """The 4 bytes of an IPv4 address: the servers keep a gathered row as float32, exact for
    integers below 2**24 only."""
    return [float(b) for b in socket.inet_aton(address)]


def _numbers_address(numbers):
    return socket.inet_ntoa(bytes(int(n) for n in numbers))


class FailureAlarm(object):
    """This worker's listener and its watch of the other workers.

    `gather(row)`: the collective all-gather of the store (WorkerAgreement.gather), which
    returns every worker's float64 row as a table (one row per rank); `raw`: MXNet's dist
    store, through which rank 0 tells the servers whom to watch."""

    def __init__(self, gather, rank, raw):
        self.rank = rank
        self.announcer = job_watch.Announcer(rank)
        table = gather(_address_numbers(self.announcer.address) + [self.announcer.port]
                       + self.announcer.token)
        workers = {r: (_numbers_address(row[:4]), int(row[4]), [float(t) for t in row[5:7]])
                   for r, row in enumerate(table)}
        self.peers = {r: peer for r, peer in workers.items() if r != rank}
        _ANNOUNCERS.append(self.announcer)
        job_watch.Watch(self.peers, self._peer_failed)
        if rank == 0:
            servers.send_command(raw, servers.watch_workers_command(workers))
            job_watch.tell_scheduler(workers)

    def raise_alarm(self, step, error):
        """Tells the job that this worker's step `step` failed with `error` (a text)."""
        self.announcer.announce(job_watch.FAILED, error, step)

    def finished(self):
        """This worker ends normally (its exit check passed)."""
        self.announcer.announce(job_watch.FINISHED)

    def _peer_failed(self, rank, message):
        wait = min(job_watch.GRACE_SECONDS, exit_wait_seconds())
        what = job_watch.describe(rank, message)
        if message is not None and message.get("step") is not None:
            text = ("dist_odsgd: %s; the servers will never have its rounds of that step, so "
                    "worker %d ends too. Resume the job from the last whole checkpoint "
                    "(odsgd.resume_or_start)" % (what, self.rank))
        else:
            text = ("dist_odsgd: %s; the job cannot go on without it, so worker %d ends too"
                    % (what, self.rank))
        self.announcer.announce(job_watch.FAILED, "ended because %s" % what)
        timer = threading.Timer(wait, job_watch.end_process, (1, text))
        timer.daemon = True
        timer.start()

