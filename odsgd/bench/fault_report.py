"""What the fault sweep measures in a case's output and files, its tables, and its pass
criteria (`passed`). The output is odsgd.launch's with --max-restarts (odsgd/cluster/restarts.py's
lines) around the job's (odsgd/bench/fault_sweep_job.py); every function here takes the
lines as (arrival time, text) pairs. Imports nothing of MXNet."""
import os
import re

import numpy as np

from .fault_cases import DECISION_WORDS, POINT_NAMES

WORKERS = 2
#: the NumPy reference's tolerance (tests/quadratic_simulation.py)
RTOL, ATOL = 2e-5, 2e-6

ATTEMPT_STARTED = re.compile(r"odsgd\.launch: attempt (\d+) of (\d+) started")
ATTEMPT_ENDED = re.compile(
    r"odsgd\.launch: attempt (\d+) of (\d+) ended: (.*); ((?:restarting|giving up|not "
    r"restarted|stopped by|no restart left|the job is done).*)$")
_WORKER = re.compile(r"^\[worker \d+(?: on [\d.]+)?\] (.*)$")


def worker_lines(lines, pattern):
    """(arrival, match) of the workers' lines whose text (after the launcher's prefix)
    matches `pattern`."""
    regex, found = re.compile(pattern), []
    for arrived, line in lines:
        prefixed = _WORKER.match(line)
        match = regex.search(prefixed.group(1)) if prefixed else None
        if match:
            found.append((arrived, match))
    return found


def attempts(lines):
    """The launcher's attempts, in order: {started, ended (arrival times; ended None while
    it runs), reason (its words for how the attempt ended), decision (what it did then)}."""
    found = []
    for arrived, line in lines:
        if ATTEMPT_STARTED.search(line):
            found.append({"started": arrived, "ended": None, "reason": None,
                          "decision": None})
        ended = ATTEMPT_ENDED.search(line)
        if ended and int(ended.group(1)) <= len(found):
            found[int(ended.group(1)) - 1].update(ended=arrived, reason=ended.group(3),
                                                   decision=ended.group(4))
    return found


def resumed_steps(lines):
    """{attempt: the step its workers resumed from} (the first worker's line)."""
    steps = {}
    for _, match in worker_lines(lines, r"^resumed from step (\d+) attempt (\d+) pid"):
        steps.setdefault(int(match.group(2)), int(match.group(1)))
    return steps


def steps_done(lines, attempt):
    """{pid: [(arrival, step), ...]} of the steps each worker of `attempt` reported done
    (trainer.step returned)."""
    done = {}
    for arrived, match in worker_lines(lines, r"^step (\d+) attempt %d loss \S+ pid (\d+)"
                                       % attempt):
        done.setdefault(int(match.group(2)), []).append((arrived, int(match.group(1))))
    return done


def done_by_every_worker(lines, attempt):
    """The steps that every worker of `attempt` reported done."""
    done = steps_done(lines, attempt)
    if len(done) < WORKERS:
        return set()
    return set.intersection(*({step for _, step in steps} for steps in done.values()))


def steps_replayed(lines):
    """Steps made again: for each attempt that failed, the steps after the checkpoint that
    the next attempt to resume resumed from, up to the last that every worker of the failed
    attempt reported done, and that a later attempt's workers all reported done again."""
    resumed, count, replayed = resumed_steps(lines), len(attempts(lines)), 0
    for failed in range(count - 1):
        done = done_by_every_worker(lines, failed)
        resumes = [resumed[later] for later in range(failed + 1, count) if later in resumed]
        if not done or not resumes:
            continue
        again = set().union(*(done_by_every_worker(lines, later)
                              for later in range(failed + 1, count)))
        replayed += len({step for step in done if step > resumes[0]} & again)
    return replayed


def first_resumed_step_at(lines, attempt):
    """The time every worker of `attempt` had reported its first step (None if not all
    did)."""
    done = steps_done(lines, attempt)
    if len(done) < WORKERS:
        return None
    return max(min(arrived for arrived, _ in steps) for steps in done.values())


def whole_saves_before(lines, before):
    """The steps whose save every worker reported done ('saved') before time `before`."""
    counts = {}
    for arrived, match in worker_lines(lines, r"^saved \S+-step(\d+) attempt"):
        if arrived < before:
            counts[int(match.group(1))] = counts.get(int(match.group(1)), 0) + 1
    return sorted(step for step, count in counts.items() if count >= WORKERS)


def measure(lines, fault_at):
    """The row's measurements from the launcher's output: restarts used, the reason and
    decision for the attempt the fault ended, the step the last attempt resumed from, the
    steps replayed and the seconds from the fault to the last attempt's first step."""
    runs = attempts(lines)
    ended = next((run for run in runs if run["ended"] is not None and
                  run["ended"] >= fault_at), runs[-1] if runs else {})
    last = len(runs) - 1
    resumed = resumed_steps(lines).get(last) if last > 0 else None
    first_step = first_resumed_step_at(lines, last) if last > 0 else None
    return {"attempts": runs, "restarts_used": max(0, last),
            "reason": ended.get("reason"), "decision": ended.get("decision"),
            "resumed_from": resumed, "steps_replayed": steps_replayed(lines),
            "whole_before_last_attempt": (whole_saves_before(lines, runs[-1]["started"])
                                          if last > 0 else []),
            "seconds_to_resumed_step": (None if first_step is None or resumed is None
                                        else first_step - fault_at)}


def compare(out, reference):
    """How far the weights in `out` (every worker's own and the global ones) are from
    `reference`'s: the largest max|a - b| / max|b| over the arrays, and whether every array
    is within the NumPy reference's tolerance (RTOL, ATOL). None where `out` has no weights
    (the job did not finish)."""
    if not all(os.path.exists(os.path.join(out, "rank%d.npz" % r)) for r in range(WORKERS)):
        return None
    worst, close = 0.0, True
    for rank in range(WORKERS):
        name = "rank%d.npz" % rank
        with np.load(os.path.join(out, name)) as got, \
                np.load(os.path.join(reference, name)) as want:
            for key in want.files:
                a, b = got[key], want[key]
                worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
                close = close and np.allclose(a, b, rtol=RTOL, atol=ATOL)
    return {"equal": bool(close), "max_relative_difference": worst}


# -- pass criteria --------------------------------------------------------------------------
def outcome_met(row):
    """Whether the launcher ended the case as expected (fault_cases.EXPECTED)."""
    expected, decision = row["expected"], row.get("decision") or ""
    if expected == "restarted":
        comparison = row.get("comparison") or {}
        last_whole = row["whole_before_last_attempt"]
        return (row["exit_code"] == 0 and comparison.get("equal", False)
                and bool(last_whole) and row["resumed_from"] == last_whole[-1])
    code_ok = {"interrupted": row["exit_code"] == 130, "not restarted": row["exit_code"] == 1,
               "gives up": row["exit_code"] not in (0, None)}[expected]
    return code_ok and decision.startswith(DECISION_WORDS[expected])


def passed(row):
    """The sweep's criterion for a row: the fault hit its point, the launcher ended the job
    as expected (restarted rows: exit 0 and equal to the uninterrupted run, resumed from the
    newest whole save), with the expected number of restarts, and nothing was left (no
    process, no namespace)."""
    return (not row["missed"] and outcome_met(row)
            and row["restarts_used"] == row["restarts_expected"]
            and row["processes"]["after_exit"] == 0 and not row["namespaces"])


# -- tables ---------------------------------------------------------------------------------
def left_text(row):
    processes = row["processes"]
    text = "%d processes" % processes["after_exit"]
    if processes["after_exit"]:
        text += (" (killed %d)" % processes["killed"] if processes["killed"] else
                 " (gone %.1f s after the exit)" % processes["gone_after"])
    return text + ", %d namespaces" % len(row["namespaces"])


def versus_text(row):
    comparison = row.get("comparison")
    if comparison is None:
        return "-"
    return "%s, %.1e" % ("equal" if comparison["equal"] else "**differs**",
                         comparison["max_relative_difference"])


def point_text(row):
    text = POINT_NAMES[row["point"]]
    if row["expected"] == "gives up":
        text += ", again"
    if row["missed"]:
        text += " (**missed**: %s)" % row["missed"]
    elif row.get("tries", 1) > 1:
        text += " (try %d)" % row["tries"]
    return text


def or_dash(value, form="%s"):
    return "-" if value is None else form % value


FAULT_COLUMNS = ("fault", "point", "--checkpoint-dir", "exit code", "restarts used",
                 "the launcher on the attempt the fault ended: reason; decision",
                 "resumed from step",
                 "steps replayed", "s from the fault to the first resumed step",
                 "left after the exit", "vs uninterrupted: every w^i and W, max rel. diff",
                 "passed")


def fault_table(rows):
    lines = ["| " + " | ".join(FAULT_COLUMNS) + " |", "|" + "---|" * len(FAULT_COLUMNS)]
    for row in rows:
        launcher = "`%s; %s`" % (row["reason"] or "none", row["decision"] or "none")
        # DIR: the case's checkpoint folder (also its --checkpoint-dir)
        launcher = launcher.replace(os.path.join(row["case"], "checkpoints"), "DIR")
        lines.append("| " + " | ".join([
            row["fault"], point_text(row), "yes" if row["checkpoint_dir"] else "no",
            or_dash(row["exit_code"]), "%d" % row["restarts_used"],
            launcher.replace("|", "/"), or_dash(row["resumed_from"]),
            "%d" % row["steps_replayed"] if row["resumed_from"] is not None else "-",
            or_dash(row["seconds_to_resumed_step"], "%.1f"), left_text(row),
            versus_text(row), "yes" if passed(row) else "**no**"]) + " |")
    return "\n".join(lines)


def cut_save_table(rows):
    """The saves the faults cut short: their files at the fault and when the attempt had
    ended, and what latest_checkpoint found then (never the cut save: it has no marker)."""
    lines = ["| fault | save | its files at the fault | when the attempt had ended | "
             "newest whole checkpoint then | the restarted attempt resumed from |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        cut = row.get("cut_save")
        if not cut:
            continue
        lines.append("| %s | step %d | %s | %s | %s | %s |" % (
            row["fault"], cut["step"], ", ".join(cut["files_at_fault"]) or "none",
            ", ".join(cut["files_at_end"]) or "none",
            or_dash(cut["latest_at_end"], "step %d"),
            or_dash(row["resumed_from"], "step %d") if row["restarts_used"] else
            "not restarted"))
    return "\n".join(lines)
