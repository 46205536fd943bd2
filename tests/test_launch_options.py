"""odsgd.launch's options: the training command goes to MXNet's launch.py whole (launch.py
parses with parse_known_args and would otherwise take the command's own -n / --num-workers /
--env), and --env-server / --env-worker reach the servers / the workers only (MXNet 1.9's
launch.py hands them to dmlc_tracker, which does not know them and runs them as part of the
command)."""
import os
import shlex
import subprocess
import sys

import pytest

from jobs.roles_job import read_records
from odsgd.cluster import launch
from odsgd.cluster.launch import parse_own_options, split_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES_JOB = os.path.join(REPO, "tests", "jobs", "roles_job.py")

#: what each role must see of EMU_ROLE_VALUE and OMP_NUM_THREADS when the launcher runs with
#: EMU_ROLE_VALUE=LAUNCHER_VALUE and OMP_NUM_THREADS=1 and ROLE_OPTIONS (shared with
#: tests/test_emulated_cluster.py). No record of the scheduler: it is odsgd/cluster/ps_scheduler.py,
#: which runs nothing of the training command.
SERVER_VALUE = 'server: "quoted" $HOME `true` \\ end'
WORKER_VALUE = "worker:1 with spaces"
LAUNCHER_VALUE = "the launcher's own"
ROLE_OPTIONS = ["--env-server", "EMU_ROLE_VALUE:" + SERVER_VALUE,
                "--env-worker", "EMU_ROLE_VALUE:" + WORKER_VALUE,
                "--env-worker", "OMP_NUM_THREADS:2"]
EXPECTED_BY_ROLE = {
    "server": [{"EMU_ROLE_VALUE": SERVER_VALUE, "OMP_NUM_THREADS": "1"}],
    "worker": [{"EMU_ROLE_VALUE": WORKER_VALUE, "OMP_NUM_THREADS": "2"}] * 2,
}


def test_training_command_keeps_its_own_options():
    argv = ["--job-timeout", "5", "-n", "2", "-s", "1", "--launcher", "local", "python",
            "train.py", "--num-workers", "1", "-n", "3", "--env", "A:1", "--note", "a b"]
    own, launcher, rest = parse_own_options(argv)
    assert own.job_timeout == 5.0 and launcher == "local"
    assert rest[:-1] == ["-n", "2", "-s", "1", "--launcher", "local"]
    assert shlex.split(rest[-1]) == ["python", "train.py", "--num-workers", "1", "-n", "3",
                                     "--env", "A:1", "--note", "a b"]


def test_split_command_skips_option_values_and_flags():
    options, command = split_command(["-n", "4", "--p3", "--launcher=ssh", "-H", "hosts",
                                      "python", "-u", "x.py"])
    assert options == ["-n", "4", "--p3", "--launcher=ssh", "-H", "hosts"]
    assert command == ["python", "-u", "x.py"]


def test_env_server_and_env_worker_are_not_handed_to_launch_py():
    """They are odsgd.launch's to pass on; launch.py's --env stays launch.py's (no prefix
    match with --env-server)."""
    argv = ["-n", "1", "--launcher", "local", "--env-server", "A:1", "--env", "C",
            "--env-worker", "B:x:y", "--env-worker", "A:2", "--env-server", "A:3", "python"]
    own, _, rest = parse_own_options(argv)
    assert own.role_env == {"server": {"A": "3"}, "worker": {"B": "x:y", "A": "2"}}
    assert rest == ["-n", "1", "--env", "C", "--launcher", "local", "python"]


@pytest.mark.parametrize("options,message", [
    (["--env-worker", "A"], "give NAME:VALUE"),
    (["--env-worker", "1A:x"], "give NAME:VALUE"),
    (["--env-server", "DMLC_ROLE:worker"], "the tracker sets DMLC_ROLE"),
    (["--env-server", "A:it's", "--launcher", "ssh", "-H", "hosts"], "single quote"),
    (["--env-server", "A:1", "--launcher", "mpi", "-H", "hosts"], "not with --launcher mpi"),
])
def test_role_environment_refused_before_anything_starts(options, message):
    with pytest.raises(SystemExit) as stop:
        parse_own_options(["-n", "1"] + options + ["python"])
    assert message in str(stop.value)


def _as_remote_shell_sees(exports, names):
    """The values a shell ends with after `exports` (bash parses the quoting, as the remote
    shell does once ssh's outer single quotes are gone)."""
    script = exports + " " + " ".join('printf "%%s\\0" "${%s-unset}";' % n for n in names)
    out = subprocess.run(["bash", "-c", script], env={}, capture_output=True, text=True,
                         check=True).stdout
    return dict(zip(names, out.split("\0")))


def test_remote_env_gives_each_role_its_values(monkeypatch):
    """ssh: a role's values over this machine's, the other role's nowhere, the tracker's
    variables untouched."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("EMU_ROLE_VALUE", LAUNCHER_VALUE)   # no forwarded prefix: stays here
    role_env = parse_own_options(["-n", "1", "--launcher", "ssh", "-H", "h"] + ROLE_OPTIONS
                                 + ["python"])[0].role_env
    names = ["EMU_ROLE_VALUE", "OMP_NUM_THREADS", "DMLC_ROLE"]
    for role, value, threads in (("server", SERVER_VALUE, "1"), ("worker", WORKER_VALUE, "2")):
        exports = launch._remote_env({"DMLC_ROLE": role, "DMLC_NUM_WORKER": 2}, role_env)
        assert _as_remote_shell_sees(exports, names) == {
            "EMU_ROLE_VALUE": value, "OMP_NUM_THREADS": threads, "DMLC_ROLE": role}
    assert "EMU_ROLE_VALUE" not in launch._remote_env({"DMLC_ROLE": "worker"}, None)


def test_local_launcher_gives_each_role_its_values(tmp_path):
    """--launcher local: a job of 2 workers and 1 server records what each process sees."""
    command = [sys.executable, "-m", "odsgd.launch", "--job-timeout", "90", "-n", "2", "-s",
               "1", "--launcher", "local"] + ROLE_OPTIONS + [
               sys.executable, ROLES_JOB, "--out", str(tmp_path),
               "--names", "EMU_ROLE_VALUE,OMP_NUM_THREADS"]
    env = dict(os.environ, EMU_ROLE_VALUE=LAUNCHER_VALUE, OMP_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert read_records(tmp_path) == EXPECTED_BY_ROLE


#: sitecustomize.py that takes sys.orig_argv away, as Python 3.8 and 3.9 have none
WITHOUT_ORIG_ARGV = "import sys\ndel sys.orig_argv\nprint('orig_argv removed', file=sys.stderr)\n"


@pytest.mark.parametrize("how", ["python -m", "console script", "python -m, no orig_argv"])
def test_the_launcher_imports_no_mxnet(how, tmp_path):
    """`python -m odsgd.launch` and the `odsgd-launch` console command only start processes:
    importing MXNet there (the package's __init__ does in a training process) added about
    2 s of one core to every job's start. Where sys.orig_argv is missing (Python < 3.10) the
    package reads the command line from /proc/self/cmdline."""
    env = dict(os.environ)
    if how == "console script":
        script = os.path.join(os.path.dirname(sys.executable), "odsgd-launch")
        assert os.path.isfile(script), ("no %s: `pip install -e .` (make install) makes it"
                                        % script)
        command = [sys.executable, "-X", "importtime", script, "--help"]
    else:
        command = [sys.executable, "-X", "importtime", "-m", "odsgd.launch", "--help"]
    if how.endswith("no orig_argv"):
        (tmp_path / "sitecustomize.py").write_text(WITHOUT_ORIG_ARGV)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), REPO, env.get("PYTHONPATH", "")])
    run = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env,
                         cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    assert ("orig_argv removed" in run.stderr) == how.endswith("no orig_argv")
    assert "Own options:" in run.stdout
    for option in ("--job-timeout SECONDS", "--max-restarts N", "--restart-on {any,failure}",
                   "--checkpoint-dir DIR"):
        assert option in run.stdout, option
    assert "--launcher" in run.stdout                        # launch.py's own help follows
    imported = [line.split("|")[-1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")]
    assert "odsgd" in imported and "odsgd.common.config" in imported     # the package is imported
    assert "odsgd.cluster.restarts" in imported
    assert not [name for name in imported if name.split(".")[0] == "mxnet"]


def test_the_package_tells_the_launcher_by_its_command_line(monkeypatch):
    """What the package's __init__ reads to leave MXNet out: the module `python -m` runs,
    through any interpreter options, or the console script's name."""
    import odsgd
    monkeypatch.setattr(sys, "argv", ["-m"])
    for argv, module in ((["-m", "odsgd.launch", "-n", "2"], "odsgd.launch"),
                         (["-X", "importtime", "-um", "odsgd.launch"], "odsgd.launch"),
                         (["-Wignore", "-modsgd.launch"], "odsgd.launch"),
                         (["--check-hash-based-pycs", "always", "-m", "x"], "x"),
                         (["-c", "import odsgd", "-m", "odsgd.launch"], None),
                         (["train.py", "-m", "odsgd.launch"], None)):
        monkeypatch.setattr(sys, "orig_argv", ["python"] + argv, raising=False)
        assert odsgd._module_run_by_interpreter() == module, argv
        assert odsgd._launcher_process() == (module == "odsgd.launch"), argv
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "odsgd.bench"], raising=False)
    assert not odsgd._launcher_process()
    for script in ("/usr/bin/odsgd-launch", "odsgd-launch-script.py", "odsgd-launch.exe"):
        monkeypatch.setattr(sys, "argv", [script, "--help"])
        assert odsgd._launcher_process(), script
    monkeypatch.setattr(sys, "argv", ["/usr/bin/odsgd-bench"])
    assert not odsgd._launcher_process()


@pytest.mark.parametrize("how", ["python -m", "console script"])
def test_bench_lists_its_subcommands(how):
    """--help: one line per subcommand, exit 0; no subcommand or an unknown one: the same
    list on stderr and a non-zero exit."""
    from odsgd.bench import SUBCOMMANDS
    command = ([sys.executable, "-m", "odsgd.bench"] if how == "python -m" else
               [os.path.join(os.path.dirname(sys.executable), "odsgd-bench")])
    runs = {args: subprocess.run(command + list(args), capture_output=True, text=True,
                                 timeout=60, cwd=REPO)
            for args in (("--help",), ("-h",), (), ("fast",))}
    for args, run in runs.items():
        listed = run.stdout if args[:1] in (("--help",), ("-h",)) else run.stderr
        assert (run.returncode == 0) == (args[:1] in (("--help",), ("-h",))), (args, run)
        lines = [line.split() for line in listed.splitlines() if line.startswith("  ")]
        assert [words[0] for words in lines] == list(SUBCOMMANDS), listed
        assert all(len(words) > 1 for words in lines), listed   # each with its summary
    assert "unknown subcommand 'fast'" in runs[("fast",)].stderr


def test_exit_wait_is_read_once_for_the_whole_job():
    from odsgd.common import config
    assert config.exit_wait_seconds({}) == config.DEFAULT_EXIT_WAIT == 30.0
    assert config.exit_wait_seconds({"ODSGD_EXIT_WAIT": " 2.5 "}) == 2.5
    for bad in ("0", "-1", "x", "inf", "nan"):
        with pytest.raises(ValueError, match="ODSGD_EXIT_WAIT=.*seconds > 0"):
            config.exit_wait_seconds({"ODSGD_EXIT_WAIT": bad})
    run = subprocess.run([sys.executable, "-m", "odsgd.launch", "-n", "1", "--launcher",
                          "local", "true"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, ODSGD_EXIT_WAIT="soon"))
    assert run.returncode != 0
    assert "odsgd.launch: ODSGD_EXIT_WAIT='soon' must be a number of seconds > 0" in run.stderr


def test_the_scheduler_stands_in_for_the_command_only_as_a_scheduler(tmp_path):
    from odsgd.cluster import ps_scheduler
    script = ps_scheduler.__file__
    env = dict(os.environ, DMLC_ROLE="worker")
    run = subprocess.run([sys.executable, script, "--job", "python train.py"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "runs as a job's scheduler only (DMLC_ROLE is 'worker'" in run.stderr
    run = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode != 0 and "usage: ps_scheduler.py --job" in run.stderr
    # MXNET_LIBRARY_PATH first, as MXNet's own loader; else the package's libmxnet.so
    lib = tmp_path / "libmxnet.so"
    lib.write_bytes(b"")
    assert ps_scheduler.library_path({"MXNET_LIBRARY_PATH": str(lib)}) == str(lib)
    import importlib.util
    package = list(importlib.util.find_spec("mxnet").submodule_search_locations)[0]
    assert ps_scheduler.library_path({}) == os.path.join(package, "libmxnet.so")
