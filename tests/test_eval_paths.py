"""While the global weights W are shown to an evaluation (ODSGD_EVAL_WEIGHTS=global, the
default), what a script does stays right: a value it writes is kept, gradients are taken at
the worker's own weights w_t, an evaluation thread never swaps W in under the training thread,
and an interrupted swap leaves nothing behind (odsgd/worker/eval_weights.py).

Each Gluon case is held to a run that did the same without the evaluation
(tests/jobs/eval_paths_job.py: every worker's w^i and W after the last step, bit for bit).
Every job runs through odsgd.launch with a deadline."""
import pytest

from cluster import run_job
from saved_weights import assert_same_weights, load_ranks

pytestmark = pytest.mark.timeout(600)


def run(tmp_path, case):
    out = tmp_path / case
    out.mkdir()
    output = run_job("eval_paths_job.py", ["--out", out, "--case", case], timeout=150)
    return load_ranks(out), output


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run(tmp_path_factory.mktemp("plain"), "plain")[0]


def test_a_value_written_while_w_is_shown_is_kept(tmp_path):
    """An EMA evaluation: W shown, then every parameter written in place. The run equals the
    one that writes the same values without the evaluation (the values are never replaced
    by the w_t set aside)."""
    ema, _ = run(tmp_path, "ema")
    written, _ = run(tmp_path, "write")
    assert_same_weights(ema, written)


@pytest.mark.parametrize("case", ["between", "thread", "interrupt"])
def test_gradients_are_taken_at_the_local_weights(tmp_path, plain, case):
    """An inference call between a recorded forward and its backward, an evaluation thread
    running beside the training loop, an evaluation interrupted inside its swap to W: each run
    equals the plain one."""
    runs, output = run(tmp_path, case)
    if case == "interrupt":
        assert "caught KeyboardInterrupt: Ctrl-C inside the swap" in output
    assert_same_weights(runs, plain)


def test_module_backward_after_an_inference_forward_is_refused(tmp_path):
    output = run_job("eval_paths_job.py", ["--out", tmp_path, "--case", "module-backward"],
                     timeout=150)
    assert output.count("refused: dist_odsgd: Module.backward right after "
                        "forward(is_train=False)") == 2
    assert "Call forward(data_batch, is_train=True) before backward" in output
