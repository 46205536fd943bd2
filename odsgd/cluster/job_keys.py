"""How `odsgd.launch` gives every process of a job the job's key (odsgd/common/job_key.py)
without putting it on a command line or in a log.

* The key: where ODSGD_JOB_KEY_FILE is set when the launcher starts, the key in that file;
  else a new random one, written to a file in a folder of its own that only this user can
  read, whose path the launcher puts in ODSGD_JOB_KEY_FILE (`job_key_file`). The attempts of
  `--max-restarts` are child launchers that inherit the variable: one key per job. The
  folder is removed when the launcher ends; one whose launcher was killed by SIGKILL, by the
  next launcher of the same user on that machine (`remove_orphans`).
* `--launcher local`: the processes inherit the variable and read the file.
* `--launcher ssh`: before the first process on a host starts, the key goes to that host
  through ssh's standard input into a new file (mode 0600, in a `mktemp -d` folder) whose
  path comes back on ssh's output (`RemoteKeys`); the remote processes get that path in
  ODSGD_JOB_KEY_FILE. Only the path is on a command line. The files are removed when the job
  ends (a launcher killed by SIGKILL leaves them, readable by this user only).
* Other launchers (mpi, sge, yarn): no key is made (they would need the file at one path on
  every host); a key file given in ODSGD_JOB_KEY_FILE is passed on as it is.
"""
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading

from ..common import job_key

LOG = logging.getLogger("odsgd.launch")
#: what makes the key's file on a remote host: its path is the only output
REMOTE_SCRIPT = ('umask 077 && d=$(mktemp -d "${TMPDIR:-/tmp}/odsgd-job.XXXXXXXX") && '
                 'cat > "$d/key" && echo "$d/key"')
_REMOTE_PATH = re.compile(r"/[\w./-]*/odsgd-job\.\w{8}/key")
#: launchers whose processes odsgd.launch gives a key of its own
KEYED_LAUNCHERS = ("local", "ssh")


def job_key_file(launcher):
    """Sets ODSGD_JOB_KEY_FILE for this launcher and its processes (see the module's
    docstring); returns the folder to remove at the end, or None. SystemExit where a given key
    file cannot be used."""
    given = (os.environ.get(job_key.KEY_FILE_VARIABLE) or "").strip()
    if given:
        try:
            job_key.read_key_file(given)
        except job_key.KeyFileError as error:
            raise SystemExit("odsgd.launch: %s" % error)
        return None
    if launcher not in KEYED_LAUNCHERS:
        LOG.warning("odsgd.launch: --launcher %s: no job key is made (its hosts would need a "
                    "key file at one path); the servers take unsigned commands unless %s "
                    "names a key file present on every host", launcher,
                    job_key.KEY_FILE_VARIABLE)
        return None
    remove_orphans()
    folder = tempfile.mkdtemp(prefix="odsgd-job-%d-" % os.getpid())
    path = os.path.join(folder, "key")
    job_key.write_key_file(path, job_key.new_key())
    os.environ[job_key.KEY_FILE_VARIABLE] = path
    return folder


def remove_orphans(directory=None):
    """Removes the key folders (`odsgd-job-<pid>-...`) of this user's launchers that no longer
    run: a launcher killed by SIGKILL cannot remove its own."""
    directory = directory or tempfile.gettempdir()
    for name in os.listdir(directory):
        match = re.fullmatch(r"odsgd-job-(\d+)-\w+", name)
        path = os.path.join(directory, name)
        if match is None or os.stat(path).st_uid != os.geteuid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass   # a process of another user has that pid now: its maker may still run


def remove_folder(folder):
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def ssh_ports(hostfile):
    """{host: ssh port} of a dmlc hostfile (`host`, `host:port`, `host slots=n`)."""
    ports = {}
    with open(hostfile) as f:
        for line in f:
            host = line.split("slots=")[0].strip()
            if host:
                name, _, port = host.partition(":")
                ports.setdefault(name, port or "22")
    return ports


class RemoteKeys(object):
    """The job key's file on each remote host of an ssh job (see the module's docstring).
    `popen`: subprocess.Popen as it was before the launcher replaced it (these ssh calls are
    no processes of the job)."""

    def __init__(self, ports, popen):
        self.ports, self.popen = ports, popen
        self.paths = {}
        self.lock = threading.Lock()

    def _ssh(self, host, script, timeout):
        return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=%d" % timeout,
                "-o", "StrictHostKeyChecking=no", "-p", self.ports.get(host, "22"), host,
                script]

    def path_on(self, host):
        """The key file's path on `host`, made there at the first call; None where the job
        has no key. SystemExit naming the host where it cannot be made."""
        key = job_key.job_key()
        if key is None:
            return None
        with self.lock:
            if host not in self.paths:
                process = self.popen(self._ssh(host, REMOTE_SCRIPT, 10), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                try:
                    out, err = process.communicate(key, timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    out, err = process.communicate()
                path = out.decode("utf-8", "replace").strip()
                if process.returncode != 0 or not _REMOTE_PATH.fullmatch(path):
                    raise SystemExit("odsgd.launch: could not give %s the job's key over ssh "
                                     "(exit %s: %s)" % (host, process.returncode,
                                                        err.decode("utf-8", "replace").strip()))
                self.paths[host] = path
            return self.paths[host]

    def remove_all(self, timeout=5.0):
        """Removes the key files it made, every host at once, `timeout` seconds at most."""
        with self.lock:
            made = dict(self.paths)
            self.paths.clear()
        processes = [(host, self.popen(self._ssh(host, "rm -rf -- '%s'" % os.path.dirname(path),
                                                 3),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)) for host, path in made.items()]
        for host, process in processes:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.returncode != 0:
                LOG.warning("odsgd.launch: could not remove the job's key file %s on %s: "
                            "remove it by hand", made[host], host)
