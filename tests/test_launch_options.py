"""odsgd.launch hands the training command to MXNet's launch.py whole: launch.py parses with
parse_known_args and would otherwise take the command's own -n / --num-workers / --env."""
import shlex

from odsgd.launch import parse_own_options, split_command


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
