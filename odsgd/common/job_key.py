"""The job's key: a secret every process of a job shares, which signs what a worker sends the
servers (their one command channel, MXNet's kController, whose body a server unpickles) and
what workers tell each other (odsgd/worker/failure_alarm.py).

Where the key comes from: the file that ODSGD_JOB_KEY_FILE names, which must belong to the
user who runs the process and be readable by that user only (mode 0600 or stricter).
`odsgd.launch` makes a random key per job and gives each process such a file (docs/cluster.md);
a job started another way names one of its own. Without the variable a job has no key and
its commands travel unsigned, as in MXNet.

A signed command is `odsgd-mac1 <sender> <counter> <mac>\\n` followed by the body MXNet would
have sent. The MAC is HMAC-SHA256 under the key over the command's head, the sender (`worker
<rank>`), the counter, the job's context (the scheduler's port and the attempt number,
ODSGD_RESTART_COUNT) and the body. A server takes a sender's counters in increasing order
only, so a command recorded on the network is refused when it is sent again, and the context
makes it useless in another attempt or job.

This module imports nothing but the standard library, not even the rest of odsgd: the
start-up hook (odsgd_autoload.py) loads it by its path where importing the package would
import the whole store. It reads ODSGD_JOB_KEY_FILE itself for that reason
(docs/env.md), and ODSGD_RESTART_COUNT for the context.
"""
import hashlib
import hmac
import os
import secrets
import stat
import sys
import threading

KEY_FILE_VARIABLE = "ODSGD_JOB_KEY_FILE"
#: the head of a signed command's first line
MAGIC = b"odsgd-mac1 "
#: the shortest key taken (bytes): 128 bits
MIN_KEY_BYTES = 16
#: MXNet's kController command id (MXNet 1.9.1 python/mxnet/kvstore/kvstore.py,
#: `_get_kvstore_server_command_type`): the one whose body a server's Python unpickles; the
#: other heads are handled in C++ (src/kvstore/kvstore_dist_server.h, CommandHandle)
CONTROLLER_HEAD = 0


class KeyFileError(ValueError):
    """The key file cannot be used: the text says why and how to mend it."""


def new_key():
    """A fresh random key: 32 random bytes as 64 hex digits (text: a user can make the same
    with `openssl rand -hex 32`)."""
    return secrets.token_hex(32).encode("ascii")


def write_key_file(path, key):
    """Writes `key` to a new file `path` that only this user can read (fails if it exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)


def read_key_file(path):
    """The key in `path`; KeyFileError naming the fix when the file is missing, belongs to
    another user, can be read by others, or holds too short a key."""
    what = "%s=%s" % (KEY_FILE_VARIABLE, path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        raise KeyFileError("%s: cannot open the job's key file (%s); give every process of "
                           "the job a file holding the same key (docs/cluster.md)"
                           % (what, error.strerror)) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError("%s is not a regular file" % what)
        if info.st_uid != os.geteuid():
            raise KeyFileError("%s belongs to uid %d, not to this user (uid %d): the key file "
                               "must be this user's own" % (what, info.st_uid, os.geteuid()))
        if info.st_mode & 0o077:
            raise KeyFileError("%s can be read or written by others (mode %o): run chmod 600 "
                               "on it, and make a new key if others may have read it"
                               % (what, stat.S_IMODE(info.st_mode)))
        key = f.read().strip()
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError("%s holds %d bytes, fewer than %d: put a random key in it, e.g. "
                           "`openssl rand -hex 32 > FILE`" % (what, len(key), MIN_KEY_BYTES))
    return key


_CACHE = {}


def job_key(environ=None):
    """This process's job key (bytes), or None where ODSGD_JOB_KEY_FILE is unset or empty;
    read once per process (KeyFileError where the file cannot be used)."""
    environ = os.environ if environ is None else environ
    path = (environ.get(KEY_FILE_VARIABLE) or "").strip()
    if not path:
        return None
    if path not in _CACHE:
        _CACHE[path] = read_key_file(path)
    return _CACHE[path]


def job_context(environ=None):
    """What ties a signature to one attempt of one job: the scheduler's port and the attempt
    number, which every process of the job has alike."""
    environ = os.environ if environ is None else environ
    return ("port=%s attempt=%s" % (environ.get("DMLC_PS_ROOT_PORT", ""),
                                    environ.get("ODSGD_RESTART_COUNT", "0") or "0")).encode()


def mac(key, *parts):
    """HMAC-SHA256 under `key` of `parts` (bytes or text), each length-prefixed so that no
    two lists of parts give the same message; hex."""
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode("utf-8")
        digest.update(b"%d:" % len(data))
        digest.update(data)
    return digest.hexdigest()


def _as_bytes(body):
    # MXNet's c_str encodes a str body as UTF-8: the bytes the server receives
    return body if isinstance(body, bytes) else str(body).encode("utf-8")


def sign(key, head, body, sender, counter, context):
    """The signed form of command (`head`, `body`): the header line, then `body` (bytes)."""
    sender = str(sender).replace(" ", "_")
    tag = mac(key, b"command", context, head, sender, counter, _as_bytes(body))
    return MAGIC + ("%s %d %s\n" % (sender, counter, tag)).encode("ascii") + _as_bytes(body)


class CommandSigner(object):
    """Signs one process's commands: the sender's counter rises by one each command."""

    def __init__(self, key, context):
        self.key, self.context = key, context
        self.counter = 0
        self.lock = threading.Lock()

    def sign(self, head, body, sender):
        with self.lock:
            self.counter += 1
            return sign(self.key, head, body, sender, self.counter, self.context)


class Verifier(object):
    """A server's check of the commands it receives (see the module's docstring)."""

    def __init__(self, key, context):
        self.key, self.context = key, context
        self.last = {}    # sender -> its newest counter taken

    def check(self, head, raw):
        """(body, sender) of a good signed command; raises Refused naming why otherwise.
        Nothing of the body is parsed, let alone unpickled, before the MAC matched."""
        raw = _as_bytes(raw)
        if not raw.startswith(MAGIC) or b"\n" not in raw:
            raise Refused("it is not signed", None)
        line, body = raw[len(MAGIC):].split(b"\n", 1)
        fields = line.decode("ascii", "replace").split(" ")
        if len(fields) != 3 or not fields[1].isdigit():
            raise Refused("its signature line is malformed", None)
        sender, counter, tag = fields[0], int(fields[1]), fields[2]
        expected = mac(self.key, b"command", self.context, head, sender, counter, body)
        if not hmac.compare_digest(expected, tag):
            raise Refused("its MAC does not match this job's key (another key, another job "
                          "or attempt, or a changed body)", sender)
        if counter <= self.last.get(sender, 0):
            raise Refused("it repeats counter %d of %s (the newest taken is %d): a replay"
                          % (counter, sender, self.last[sender]), sender)
        self.last[sender] = counter
        return body, sender


class Refused(Exception):
    """A command that a server does not run: why, and the sender it claims (unverified)."""

    def __init__(self, why, claimed):
        super(Refused, self).__init__(why)
        self.why, self.claimed = why, claimed


def pickle_globals(body, limit=6):
    """The callables and classes a pickle would look up when unpickled ('posix.system'),
    read with pickletools without unpickling anything; for the refusal's log line."""
    import pickletools
    found, strings = [], []
    try:
        for opcode, arg, _ in pickletools.genops(_as_bytes(body)):
            if opcode.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append("%s.%s" % (strings[-2], strings[-1]))
            elif isinstance(arg, str):
                strings.append(arg)
            if len(found) >= limit:
                break
    except Exception:  # noqa: BLE001 - not a pickle, or a broken one: say what was read
        found.append("(not a whole pickle)")
    return found


def sign_commands_of(kvstore_class):
    """Makes MXNet's `KVStore._send_command_to_servers` (python/mxnet/kvstore/kvstore.py, the
    call set_optimizer makes; MXNet 1.9.1) sign kController commands with this process's job
    key, where it has one. Idempotent. Called by the start-up hook when a worker makes a
    dist store, and by DistODSGD."""
    original = kvstore_class._send_command_to_servers
    if getattr(original, "_odsgd_signed", False):
        return
    signers = {}

    def send_signed(self, head, body):
        key = job_key()
        if key is not None and int(head) == CONTROLLER_HEAD:
            context = job_context()
            if context not in signers:
                signers[context] = CommandSigner(key, context)
            signed = signers[context].sign(head, body, "worker-%d" % self.rank)
            # MXNet's c_str takes text (it encodes it as UTF-8 again)
            body = signed if isinstance(body, bytes) else signed.decode("utf-8")
        return original(self, head, body)

    send_signed._odsgd_signed = True
    send_signed.__doc__ = original.__doc__
    kvstore_class._send_command_to_servers = send_signed

