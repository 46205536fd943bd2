"""A server runs only the commands of its own job: each kController command (the body MXNet's
server unpickles: the optimizer of `set_optimizer`, odsgd's commands of updater.py) must carry
a MAC under the job's key (odsgd/common/job_key.py), checked before anything of the body is
read. Anything else is refused: nothing of it runs, the server logs what it refused and what
the sender claimed to be, answers the sender as if it had run it, and the job goes on
(docs/cluster.md, "Who may reach a job", argues why it does not end).

Installed by the start-up hook (odsgd_autoload.py) when MXNet's `import mxnet` makes a
server's store, before the server loop starts inside that import: `install` wraps
`KVStoreServer._controller` (MXNet 1.9.1 python/mxnet/kvstore/kvstore_server.py), which
`KVStoreServer.run` calls once to get the callback it hands to MXKVStoreRunServer.

A server whose job has no key (ODSGD_JOB_KEY_FILE unset) runs every command as MXNet does,
and says so once at start.
"""
import os
import sys

from ..common import job_key, job_watch


def _say(text):
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def install(server_class, role):
    """Guards the commands of `server_class` (MXNet's KVStoreServer) in this process, whose
    DMLC_ROLE is `role` ('server' or 'scheduler': a scheduler receives no command, but runs
    the same class). A key file that cannot be used ends a server with code 1: it must not
    run unauthenticated in a job that meant to have a key."""
    original = server_class._controller
    if getattr(original, "_odsgd_guarded", False):
        return
    try:
        key = job_key.job_key()
    except job_key.KeyFileError as error:
        if role != "server":
            return
        _say("odsgd server: %s; the server ends: it would otherwise run commands unchecked"
             % error)
        sys.stdout.flush()
        os._exit(1)
    if role == "scheduler":
        # a scheduler started by hand (odsgd.launch's does not come here) ends with the
        # workers: rank 0 tells it whom to watch (odsgd/common/job_watch.py)
        job_watch.serve_scheduler()
    if role == "server" and key is None:
        _say("odsgd server: this job has no key (%s is unset): the commands this server "
             "unpickles are not authenticated, and any process that reaches its port can run "
             "code as this user (docs/cluster.md, \"Who may reach a job\")"
             % job_key.KEY_FILE_VARIABLE)

    def guarded_controller(self):
        run = original(self)
        verifier = job_key.Verifier(key, job_key.job_context()) if key is not None else None

        def server_controller(cmd_id, cmd_body, handle):
            if cmd_id != job_key.CONTROLLER_HEAD:
                return run(cmd_id, cmd_body, handle)
            if verifier is None:
                # no key here: a signed body loses its signature line and runs, as any other
                return run(cmd_id, _unsigned(cmd_body), handle)
            try:
                body, _sender = verifier.check(cmd_id, cmd_body)
            except job_key.Refused as refused:
                _say(refusal(self.kvstore.rank, cmd_id, cmd_body, refused))
                return None
            return run(cmd_id, body, handle)
        return server_controller

    guarded_controller._odsgd_guarded = True
    guarded_controller.__doc__ = original.__doc__
    server_class._controller = guarded_controller


def _unsigned(body):
    if body.startswith(job_key.MAGIC) and b"\n" in body:
        return body.split(b"\n", 1)[1]
    return body


def refusal(rank, head, body, refused):
    """The log line of a refused command: why, who it claims to be from, what it would run."""
    claimed = ("it claims to come from %s (unverified)" % refused.claimed
               if refused.claimed else "its sender is unknown")
    unsigned = _unsigned(body)
    return ("odsgd server %d: refused a command (head %d, %d bytes): %s; %s: ps-lite does not "
            "tell a server which node sent a command. Nothing of it ran (unpickled, it would "
            "have called %s); the job goes on. A worker of this job without the job's key "
            "sends such commands: give every process the same %s (docs/cluster.md)"
            % (rank, head, len(body), refused.why, claimed,
               ", ".join(job_key.pickle_globals(unsigned)) or "nothing",
               job_key.KEY_FILE_VARIABLE))
