"""The job's key (odsgd/common/job_key.py): signed commands to the servers, checked before
anything is unpickled, and the key files that carry it (docs/cluster.md, "Who may reach a
job")."""
import json
import os
import sys

import pytest

from cluster import JOBS, HandStartedJob
from odsgd.common import job_key


def _key_file(folder, mode=0o600, key=None):
    path = os.path.join(str(folder), "key")
    job_key.write_key_file(path, key or job_key.new_key())
    os.chmod(path, mode)
    return path


def test_a_key_file_others_can_read_is_refused_naming_the_fix(tmp_path):
    path = _key_file(tmp_path, 0o640)
    with pytest.raises(job_key.KeyFileError, match="chmod 600"):
        job_key.read_key_file(path)
    os.chmod(path, 0o600)
    assert job_key.read_key_file(path) == open(path, "rb").read()
    short = tmp_path / "short"
    job_key.write_key_file(str(short), b"0123456789")
    with pytest.raises(job_key.KeyFileError, match="fewer than 16"):
        job_key.read_key_file(str(short))


def test_a_server_takes_each_signed_command_once_and_nothing_else():
    key, context = job_key.new_key(), b"port=9 attempt=0"
    signer = job_key.CommandSigner(key, context)
    verifier = job_key.Verifier(key, context)
    first, second = signer.sign(0, "body one", "worker-0"), signer.sign(0, "body two", "worker-0")
    assert verifier.check(0, second) == (b"body two", "worker-0")
    for bad, why in ((first, "replay"), (second, "replay"),
                     (first.replace(b"body one", b"body 1!!"), "MAC does not match"),
                     (job_key.sign(job_key.new_key(), 0, "x", "worker-0", 9, context),
                      "MAC does not match"),
                     (job_key.sign(key, 0, "x", "worker-0", 9, b"port=9 attempt=1"),
                      "MAC does not match"),
                     (b"(dp0\n.", "not signed")):
        with pytest.raises(job_key.Refused, match=why):
            verifier.check(0, bad)


@pytest.mark.timeout(120)
def test_an_unsigned_pickled_command_is_refused_and_the_signed_one_runs(tmp_path):
    """A hand-started dist_sync job (scheduler, 1 server, 2 workers) whose server and one worker
    have the key and the other worker has not: that worker's unsigned command, which would write a file
    and install SGD at rate 100, is refused (no file; the server names what it would have run)
    and the job goes on; the same command signed with the key writes its file and installs
    SGD at rate 1, so the servers' weights after one round of ones from 2 workers are
    0 - 1 * 2 = -2 on both workers (no optimizer: 2; rate 100: -200)."""
    key_file = _key_file(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, os.path.join(JOBS, "rogue_command_job.py"), "--out", out,
            "--key-file", key_file]
    keyed = {"ODSGD_JOB_KEY_FILE": key_file}
    job = HandStartedJob([(argv, keyed), (argv + ["--rogue"], {"ODSGD_JOB_KEY_FILE": None})],
                         env=keyed)
    try:
        codes = job.wait(90)
    finally:
        job.end()
    assert codes == {"scheduler": 0, "server 0": 0, "worker 0": 0, "worker 1": 0}, job.output()
    server = job.output("server 0")
    assert "refused a command (head 0" in server and "it is not signed" in server, server
    assert "posix.system" in server, server
    assert server.count("refused a command") == 1, server
    assert not (out / "unsigned.txt").exists()
    assert (out / "signed.txt").read_text() == "ran\n"
    for rank in (0, 1):
        result = json.loads((out / ("rank%d.json" % rank)).read_text())
        assert result["pulled"] == [-2.0] * 4, result


def test_the_key_folders_of_launchers_that_no_longer_run_are_removed(tmp_path):
    """A launcher killed by SIGKILL leaves its key folder; the next one removes it, and
    keeps the folder of a launcher that still runs (here: this process)."""
    import subprocess
    from odsgd.cluster import job_keys
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / ("odsgd-job-%d-abc123" % gone.pid)
    alive = tmp_path / ("odsgd-job-%d-def456" % os.getpid())
    other = tmp_path / "odsgd-job-notapid"
    for folder in (dead, alive, other):
        folder.mkdir()
        _key_file(folder)
    job_keys.remove_orphans(str(tmp_path))
    assert not dead.exists() and alive.exists() and other.exists()
