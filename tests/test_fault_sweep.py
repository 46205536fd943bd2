"""The fault sweep (`python -m odsgd.bench faults`, docs/reliability.md section 7): its cases,
what it reads from the launcher's output, its pass criteria and tables (cheap, on made-up
output), and two cases run for real on emulated hosts under `odsgd.launch --max-restarts 1`:
a worker killed and a worker host's link down, each while a step's rounds are on the wire.
The job restarts itself from its newest whole checkpoint and must end with every worker's w^i
and W equal to an uninterrupted job's, leaving nothing behind. The full sweep (7 faults x 6
points) is the command.

The two real cases need root and openssh-server (emulated hosts); skipped with the reason
otherwise."""
import os

import numpy as np
import pytest

from odsgd.cluster import emulate
from odsgd.bench import fault_cases, fault_report, faults

try:
    emulate.require_root_and_sshd()
    MISSING = None
except emulate.EmulationError as error:
    MISSING = str(error)

needs_hosts = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


# -- cases ----------------------------------------------------------------------------------
def test_the_plan_strikes_every_fault_at_every_point_and_gives_up_once():
    cases = fault_cases.plan()
    assert len(cases) == 7 * 6 + 1
    assert {(c.fault, c.point) for c in cases[:-1]} == \
        {(f, p) for f in fault_cases.FAULTS for p in fault_cases.POINTS}
    for case in cases[:-1]:
        first = case.point in fault_cases.FIRST_POINTS
        # the first attempt saved before its fault: --checkpoint-dir lets it restart; a
        # fault in the restarted attempt comes before it saved anything: without it
        assert case.checkpoint_dir == first and case.max_restarts == (1 if first else 2)
        assert case.first_fault == (None if first else ("worker killed", "in-flight"))
        expected = {"ctrl-c": "interrupted", "value-error": "not restarted"}.get(
            case.fault, "restarted")
        assert case.expected == expected
        assert case.restarts_expected == (0 if first else 1) + (expected == "restarted")
    give_up = cases[-1]
    assert (give_up.checkpoint_dir, give_up.max_restarts, give_up.expected,
            give_up.restarts_expected) == (True, 2, "gives up", 1)
    with pytest.raises(ValueError, match="unknown fault"):
        fault_cases.case("power cut", "save")


def test_the_job_arguments_of_a_case(tmp_path):
    sweep = faults.Sweep(faults.parse_args([]), str(tmp_path))
    args = [str(a) for a in faults.case_job_args(
        sweep, fault_cases.case("hang", "load"), str(tmp_path / "c"), "tag", "198.18.0.3")]
    assert args[args.index("--inject") + 1] == "hang:load:1"
    assert args[args.index("--mark") + 1] == "in-flight:0"   # the first fault's point
    args = [str(a) for a in faults.case_job_args(
        sweep, fault_cases.case("server killed", "save"), str(tmp_path / "d"), "tag", "h")]
    assert "--mark" not in args and "--inject" not in args   # aimed at by its files
    with pytest.raises(SystemExit):
        faults.parse_args(["--fault-step", "12"])   # a save step


def test_a_fault_during_a_save_cut_it_only_before_the_file_it_acts_on():
    whole = ["worker0.params", "worker0.states", "worker0.states.servers", "worker1.params",
             "worker1.states", ".whole.json"]
    assert faults.cut_the_save("worker killed", ["worker1.params"], whole)
    assert not faults.cut_the_save("worker killed", ["worker1.params", "worker1.states"],
                                   whole)
    assert faults.cut_the_save("server killed", ["worker0.params", "worker0.states"], whole)
    assert not faults.cut_the_save("server killed", whole[:3], whole)
    assert faults.cut_the_save("scheduler killed", whole[:-1], whole)
    assert not faults.cut_the_save("scheduler killed", whole, whole)
    # Ctrl-C acts when the launcher ends the job: the save must not be whole by then
    assert faults.cut_the_save("ctrl-c", [], whole[:-1])
    assert not faults.cut_the_save("ctrl-c", [], whole)


# -- what the sweep reads from the launcher's output ----------------------------------------
def launcher_output():
    """A two-attempt job as odsgd.launch --max-restarts 1 prints it: attempt 0 (workers of
    pids 21 and 22) saves after step 4, worker 22 reports steps up to 6 and worker 21 up to
    5 when the fault strikes (t = 110); attempt 1 (pids 31, 32) resumes from step 4."""
    lines = [(100.0, "I odsgd.launch: attempt 1 of 2 started (pid 10, ODSGD_RESTART_COUNT=0)")]
    for pid in (21, 22):
        lines.append((101.0, "[worker 0 on 198.18.0.2] resumed from step 0 attempt 0 pid %d"
                      % pid))
        for step in range(1, 6 + (pid == 22)):
            lines.append((101.0 + step, "[worker 0 on 198.18.0.2] step %d attempt 0 loss 0.5 "
                          "pid %d" % (step, pid)))
            if step == 4:
                lines.append((105.5, "[worker 1 on 198.18.0.3] saved d/fault-job-step000000004 "
                              "attempt 0"))
    lines += [(110.5, "E odsgd.launch: worker 0 on 198.18.0.2 (pid 5) exited with code 255; "
                      "ended the job 0.1 s after the failure (ended scheduler)"),
              (110.6, "E odsgd.launch: attempt 1 of 2 ended: worker 0 on 198.18.0.2 (pid 5) "
                      "exited with code 255 (ssh: lost); restarting (resumes from "
                      "d/fault-job-step000000004, step 4)"),
              (110.7, "I odsgd.launch: attempt 2 of 2 started (pid 11, ODSGD_RESTART_COUNT=1)")]
    for pid, first_step_at in ((31, 115.0), (32, 116.0)):
        lines += [(112.0, "[worker 0 on 198.18.0.2] resumed from step 4 attempt 1 pid %d" % pid),
                  (first_step_at, "[worker 0 on 198.18.0.2] step 5 attempt 1 loss 0.4 pid %d"
                   % pid),
                  (first_step_at + 1, "[worker 0 on 198.18.0.2] step 6 attempt 1 loss 0.3 pid %d"
                   % pid)]
    lines.append((120.0, "I odsgd.launch: attempt 2 of 2 ended: exit code 0; the job is done"))
    return lines


def test_measures_from_the_launchers_output():
    measured = fault_report.measure(launcher_output(), fault_at=110.0)
    assert measured["restarts_used"] == 1
    assert measured["reason"] == "worker 0 on 198.18.0.2 (pid 5) exited with code 255 (ssh: lost)"
    assert measured["decision"] == "restarting (resumes from d/fault-job-step000000004, step 4)"
    assert measured["resumed_from"] == 4
    # every worker had reported step 5 (one of them 6 too): 5 - 4
    assert measured["steps_replayed"] == 1
    # the second worker's first step of attempt 1 came at 116: 6 s after the fault
    assert measured["seconds_to_resumed_step"] == pytest.approx(6.0)
    assert measured["whole_before_last_attempt"] == [4]
    assert [(a["started"], a["ended"]) for a in measured["attempts"]] == \
        [(100.0, 110.6), (110.7, 120.0)]


def test_an_attempt_that_was_not_restarted_has_no_resume():
    lines = [line for line in launcher_output() if line[0] < 110.6]
    lines.append((110.6, "E odsgd.launch: attempt 1 of 2 ended: interrupted; stopped by "
                         "Ctrl-C / SIGTERM to the launcher, never restarted"))
    measured = fault_report.measure(lines, fault_at=110.0)
    assert (measured["restarts_used"], measured["resumed_from"], measured["steps_replayed"],
            measured["seconds_to_resumed_step"]) == (0, None, 0, None)
    assert measured["decision"].startswith("stopped by Ctrl-C")


def attempt_lines(number, total, started, resumed, steps, ending):
    """Attempt `number` (1-based) of `total` as the launcher prints it: started at `started`,
    its workers (pid: the steps each reported) resumed from `resumed` (None: no load was
    reached), ending with the launcher's `ending` words."""
    lines = [(started, "I odsgd.launch: attempt %d of %d started (pid 1, "
                       "ODSGD_RESTART_COUNT=%d)" % (number, total, number - 1))]
    worker = "[worker 0 on 198.18.0.2] "
    for pid, done in steps.items():
        if resumed is not None:
            lines.append((started + 1, worker + "resumed from step %d attempt %d pid %d"
                          % (resumed, number - 1, pid)))
        lines += [(started + 1 + step, worker + "step %d attempt %d loss 0.1 pid %d"
                   % (step, number - 1, pid)) for step in done]
    lines.append((started + 30, "E odsgd.launch: attempt %d of %d ended: %s"
                  % (number, total, ending)))
    return lines


def test_steps_replayed_count_the_steps_a_later_attempt_made_again():
    killed = "worker 0 (pid 5) was killed by signal 9 (SIGKILL); restarting"
    # the second attempt fails before its load; the third resumes from step 4 and makes
    # steps 5 and 6 again: step 5, which every worker of the first had done, is replayed
    lines = (attempt_lines(1, 3, 100, 0, {21: range(1, 6), 22: range(1, 7)}, killed) +
             attempt_lines(2, 3, 200, None, {}, killed) +
             attempt_lines(3, 3, 300, 4, {31: range(5, 9), 32: range(5, 9)},
                           "exit code 0; the job is done"))
    assert fault_report.steps_replayed(lines) == 1
    assert fault_report.measure(lines, fault_at=250)["seconds_to_resumed_step"] == 56
    # the second attempt resumes from 4 and only one worker makes step 5 before the launcher
    # gives up: nothing was done again
    lines = (attempt_lines(1, 3, 100, 0, {21: range(1, 6), 22: range(1, 7)}, killed) +
             attempt_lines(2, 3, 200, 4, {31: [5], 32: []}, "worker 1 (pid 6) was killed "
                           "by signal 9 (SIGKILL); giving up: the attempt made no new whole "
                           "checkpoint in d (the newest is still d/x, step 4)"))
    measured = fault_report.measure(lines, fault_at=210)
    assert (measured["steps_replayed"], measured["resumed_from"]) == (0, 4)
    assert measured["decision"].startswith("giving up")


def save_weights(folder, scale):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(0)
    for rank in range(fault_report.WORKERS):
        arrays = {"local/w": rng.standard_normal(5).astype(np.float32) * scale,
                  "global/w": np.arange(1, 6, dtype=np.float32)}
        np.savez(os.path.join(folder, "rank%d.npz" % rank), **arrays)


def test_compare_with_the_uninterrupted_weights(tmp_path):
    save_weights(tmp_path / "ref", 1.0)
    save_weights(tmp_path / "same", 1.0)
    assert fault_report.compare(str(tmp_path / "same"), str(tmp_path / "ref")) == \
        {"equal": True, "max_relative_difference": 0.0}
    save_weights(tmp_path / "off", 1.01)
    found = fault_report.compare(str(tmp_path / "off"), str(tmp_path / "ref"))
    with np.load(str(tmp_path / "ref" / "rank1.npz")) as ref:
        expected = np.abs(ref["local/w"] * 0.01).max() / np.abs(ref["local/w"]).max()
    assert not found["equal"]
    assert found["max_relative_difference"] == pytest.approx(expected, rel=1e-3)
    assert fault_report.compare(str(tmp_path / "none"), str(tmp_path / "ref")) is None


# -- pass criteria and tables ---------------------------------------------------------------
def row_of(case, **measured):
    """A row of `case` that meets its expectation, with `measured` over it."""
    met = dict(missed=None, tries=1, restarts_used=case.restarts_expected, resumed_from=8,
               steps_replayed=1, whole_before_last_attempt=[4, 8], seconds_to_resumed_step=7.5,
               processes={"after_exit": 0, "gone_after": 1.0, "killed": 0}, namespaces=[],
               comparison={"equal": True, "max_relative_difference": 0.0},
               reason="worker 1 (pid 3) was killed", decision="restarting", exit_code=0)
    met.update(measured)
    return case.row(**met)


def test_a_restarted_row_passes_only_exit_0_equal_from_the_newest_save_and_clean():
    case = fault_cases.case("worker killed", "in-flight")
    assert fault_report.passed(row_of(case))
    failing = [dict(exit_code=1), dict(comparison={"equal": False,
                                                   "max_relative_difference": 0.1}),
               dict(comparison=None), dict(resumed_from=4), dict(restarts_used=2),
               dict(missed="the target got past it first"), dict(namespaces=["ns"]),
               dict(processes={"after_exit": 1, "gone_after": 2.0, "killed": 0})]
    for measured in failing:
        assert not fault_report.passed(row_of(case, **measured)), measured


def test_ctrl_c_value_error_and_giving_up_pass_without_a_restart_of_their_attempt():
    interrupted = fault_cases.case("ctrl-c", "load")
    stopped = "stopped by Ctrl-C / SIGTERM to the launcher, never restarted"
    assert fault_report.passed(row_of(interrupted, exit_code=130, decision=stopped,
                                      comparison=None))
    assert not fault_report.passed(row_of(interrupted, exit_code=0, decision="the job is done"))
    value_error = fault_cases.case("value-error", "save")
    assert fault_report.passed(row_of(value_error, exit_code=1, decision="not restarted: a "
                                      "process exited with an error", comparison=None))
    assert not fault_report.passed(row_of(value_error, exit_code=1, decision="restarting"))
    give_up = fault_cases.give_up_case()
    words = "giving up: the attempt made no new whole checkpoint in d (the newest is still x)"
    assert fault_report.passed(row_of(give_up, exit_code=1, decision=words, comparison=None))
    assert not fault_report.passed(row_of(give_up, exit_code=1, decision="no restart left"))


def test_the_tables():
    case = fault_cases.case("worker killed", "save")
    row = row_of(case, cut_save={"step": 12, "files_at_fault": ["worker1.params"],
                                 "files_at_end": ["worker0.params", "worker1.params"],
                                 "latest_at_end": 8})
    lines = fault_report.fault_table([row]).splitlines()
    assert len(lines) == 3
    cells = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert len(cells) == len(fault_report.FAULT_COLUMNS)
    assert cells[:5] == ["worker killed", "during a save", "yes", "0", "1"]
    assert cells[6:] == ["8", "1", "7.5", "0 processes, 0 namespaces", "equal, 0.0e+00", "yes"]
    cut = fault_report.cut_save_table([row]).splitlines()[2]
    assert cut == ("| worker killed | step 12 | worker1.params | worker0.params, "
                   "worker1.params | step 8 | step 8 |")


# -- real cases on emulated hosts -----------------------------------------------------------
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A short sweep (6 steps, saves after 2, 4, 6; the faults at step 5) and its
    uninterrupted job's weights."""
    args = faults.parse_args(["--steps", "6", "--save-every", "2", "--fault-step", "5",
                              "--save-step", "6", "--timeout", "90"])
    sweep = faults.Sweep(args, str(tmp_path_factory.mktemp("sweep")))
    reference, _ = faults.uninterrupted(sweep)
    return sweep, reference


def assert_restarted_equal_and_clean(row, others):
    assert row["missed"] is None, row   # the fault came with the step's rounds on the wire
    assert row["exit_code"] == 0 and row["restarts_used"] == 1, row
    assert row["decision"].startswith("restarting (resumes from"), row
    assert row["resumed_from"] == 4 == row["whole_before_last_attempt"][-1], row
    assert row["comparison"]["equal"], row
    assert row["processes"]["after_exit"] == 0 and row["namespaces"] == [], row
    assert emulate.leftovers(ignore_creators=others) == []
    assert fault_report.passed(row)


#: fault -> words the launcher's reason for ending the first attempt must have
REASON_WORDS = {
    "worker killed": ["exited with code 255 (ssh:"],
    # the launcher's ssh client to the unplugged host gave up on it
    "link down": ["worker", "198.18.0.", "ssh: the connection to"],
}


@needs_hosts
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["worker killed", "link down"])
def test_fault_with_rounds_in_flight_restarts_equal_to_uninterrupted(sweep, fault):
    """A worker killed or a worker host's link down while a step's rounds are on the wire."""
    others = emulate.other_creators()
    sweep, reference = sweep
    row = faults.run_case(sweep, fault_cases.case(fault, "in-flight"), reference)
    assert_restarted_equal_and_clean(row, others)
    for words in REASON_WORDS[fault]:
        assert words in row["reason"], row
