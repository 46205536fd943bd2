"""`python -m odsgd.bench convergence`: its mode syntax and summary (no cluster), and one tiny
study (1 seed, 2 epochs, 2 modes) through real 2-worker jobs."""
import json
import os

import pytest

from odsgd.bench import convergence


def test_modes_become_store_environment():
    assert convergence.parse_mode("dist_sync") == ("dist_sync", {})
    kvstore, env = convergence.parse_mode("odsgd:local_optimizer=sgd,warmup_steps=0")
    assert kvstore == "dist_odsgd"
    assert env["ODSGD_LOCAL_OPTIMIZER"] == "sgd" and env["ODSGD_WARMUP_STEPS"] == "0"
    assert env["ODSGD_LOCAL_LR"] == ""         # unnamed settings are cleared: defaults
    assert convergence.parse_mode("odsgd")[1]["ODSGD_WARMUP_STEPS"] == ""
    for bad in ("odsgd:warmup=3", "odsgd:warmup_steps=x", "dist_foo"):
        with pytest.raises(ValueError):
            convergence.parse_mode(bad)
    assert convergence.split_modes("dist_sync,odsgd:local_optimizer=sgd,local_lr=0.2,odsgd") \
        == ["dist_sync", "odsgd:local_optimizer=sgd,local_lr=0.2", "odsgd"]
    assert convergence.split_modes("odsgd:warmup_steps=0;dist_async") == [
        "odsgd:warmup_steps=0", "dist_async"]


def test_summary_and_target():
    def run(mode, seed, acc):
        return {"setting": "mlp", "mode": mode, "seed": seed, "final_test_accuracy": acc,
                "wall_time": 1.0}
    runs = [run("dist_sync", 0, 0.98), run("dist_sync", 1, 0.96),
            run("dist_async", 0, 0.95), run("dist_async", 1, 0.95),
            run("odsgd", 0, 0.97), run("odsgd", 1, 0.964),     # mean 0.967 >= 0.97 - 0.005
            run("bad", 0, 0.99), run("bad", 1, 0.90),         # mean 0.945 < async
            {"setting": "mlp", "mode": "bad", "seed": 2, "error": "boom"}]
    summary = convergence.summarize(runs)["mlp"]
    assert summary["dist_sync"]["mean"] == pytest.approx(0.97)
    assert summary["dist_sync"]["std"] == pytest.approx(0.01)
    assert summary["odsgd"]["minus_dist_sync"] == pytest.approx(-0.003)
    assert summary["odsgd"]["meets_target"] is True
    assert summary["bad"]["meets_target"] is False and summary["bad"]["failed"] == 1


@pytest.mark.timeout(300)
def test_tiny_study_writes_json_and_plot(tmp_path, capsys):
    code = convergence.main(["--settings", "mlp", "--modes", "dist_sync;odsgd:warmup_steps=0",
                             "--seeds", "0", "--epochs", "2", "--timeout", "120",
                             "--out", str(tmp_path)])
    assert code == 0
    with open(tmp_path / "convergence.json") as f:
        report = json.load(f)
    assert {"command", "settings", "modes", "seeds", "epochs", "runs", "summary"} <= set(report)
    assert [(r["mode"], r["seed"]) for r in report["runs"]] == [
        ("dist_sync", 0), ("odsgd:warmup_steps=0", 0)]
    for record in report["runs"]:
        assert len(record["accuracy_per_epoch"]) == 2
        walls = record["wall_time_per_epoch"]
        assert len(walls) == 2 and 0 < walls[0] < walls[1] == record["wall_time"]
        # 2 epochs of 44 steps: far above chance (10%)
        assert record["final_test_accuracy"] > 0.6
        assert record["final_test_accuracy"] == record["accuracy_per_epoch"][-1]
    od = report["runs"][1]
    assert od["kvstore"] == "dist_odsgd" and od["store"]["warmup_steps"] == 0
    assert od["env"] == {"ODSGD_WARMUP_STEPS": "0"}
    assert set(report["summary"]["mlp"]) == {"dist_sync", "odsgd:warmup_steps=0"}
    with open(tmp_path / "convergence.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(tmp_path / "convergence.png") > 10000
    printed = capsys.readouterr().out
    assert "[2/2] mlp" in printed and "| dist_sync |" in printed
