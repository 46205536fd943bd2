"""One case of the fault sweep (`python -m odsgd.bench faults`, docs/reliability.md section
7) that no other test makes: a worker host's link goes down while a step's rounds are on the
wire. The job must end within the sweep's bound with the launcher naming the host and the
worker, leave nothing, and the saves every worker finished must be whole. The full sweep
(4 faults x 3 points, each resumed and compared with an uninterrupted job) is the command.

Needs root and openssh-server (emulated hosts); skipped with the reason otherwise."""
import pytest

from odsgd import emulate
from odsgd.bench import faults

try:
    emulate.require_root_and_sshd()
    MISSING = None
except emulate.EmulationError as error:
    MISSING = str(error)

pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


@pytest.mark.timeout(120)
def test_link_down_with_rounds_in_flight_ends_the_job_and_keeps_the_saves(tmp_path):
    args = faults.parse_args(["--steps", "6", "--save-every", "2", "--fault-step", "5",
                              "--save-step", "4", "--timeout", "90"])
    others = emulate.other_creators()
    row = faults.run_fault(faults.Sweep(args, str(tmp_path)), "link down", "in-flight")
    assert row["exit_code"] == 1, row
    assert row["seconds"] <= faults.END_SECONDS, row
    assert not row["rounds_done_before_fault"], row   # the fault came with rounds on the wire
    worker_host = row["reason"]
    assert "worker" in worker_host and "198.18.0." in worker_host, row
    assert row["processes"]["after_exit"] == 0 and row["namespaces"] == [], row
    assert emulate.leftovers(ignore_creators=others) == []
    # the other worker may go on into step 6 and its save, which then waits for the round
    assert row["whole_saves"] == [2, 4], row
    for step in row["whole_saves"]:
        files = faults.files_of(row["checkpoints"], step)
        assert not [f for f in files if f.endswith(".tmp")], files
        assert {"worker0.params", "worker1.params", "worker0.states", "worker1.states"} <= \
            set(files), files
