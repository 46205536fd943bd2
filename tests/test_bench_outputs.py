"""What the benchmarks and studies write by default lies under runs/, which git ignores: a
`make bench` or a study leaves `git status` clean, and never rewrites the tracked records of
results/ and docs/ that the docs cite and the tests read (those are copied there by hand)."""
import os
import re
import subprocess

from cluster import REPO


def ignored_by_git(path):
    """Whether a pattern of .gitignore covers `path` (relative to the repository), tracked or
    not: `git check-ignore --no-index` exits 0."""
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path],
                          cwd=REPO).returncode == 0


def test_the_benchmarks_default_outputs_are_ignored():
    from odsgd.bench import convergence, throughput, time_to_accuracy, timeline
    paths = []
    for module in (convergence, time_to_accuracy, throughput, timeline):
        args = module.parse_args([])
        paths += [p for p in (getattr(args, "out", None), getattr(args, "json", None)) if p]
    assert len(paths) == 5
    for path in paths:
        assert path.startswith("runs/") and ignored_by_git(path + "/x"), path


def test_make_bench_demo_and_the_suites_write_under_runs():
    with open(os.path.join(REPO, "Makefile")) as f:
        makefile = f.read()
    bench = re.search(r"^bench:.*\n\t(.+)$", makefile, re.M).group(1)
    assert bench.endswith("scripts/bench_throughput_suite.sh runs/bench"), bench
    for script in ("scripts/bench_throughput_suite.sh", "scripts/bench_paper_cluster.sh"):
        with open(os.path.join(REPO, script)) as f:
            default = re.search(r"^OUT=\$\{1:-([^}]+)\}$", f.read(), re.M).group(1)
        assert ignored_by_git(default + "/throughput_x.json"), (script, default)
    with open(os.path.join(REPO, "examples", "demo.py")) as f:
        demo = re.search(r'"--json", default="([^"]+)"', f.read()).group(1)
    assert ignored_by_git(demo), demo


def test_the_records_the_tests_read_are_tracked():
    tracked = subprocess.run(["git", "ls-files", "results", "docs"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    assert "results/paper_cluster_rn50_8w1s.json" in tracked
    # no ignore pattern covers the records: a new one copied there is seen by `git status`
    assert not [path for path in tracked if path.endswith(".json") and ignored_by_git(path)]
