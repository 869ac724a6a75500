"""The suite's order under `--dist worksteal` (tests/conftest.py): pytest-xdist's own work-stealing
scheduler gives each worker a share that begins with its slow tests, so no worker gets them all."""

import os
import types

import pytest

from tests.conftest import dealt_order

xdist_worksteal = pytest.importorskip("xdist.scheduler.worksteal")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Node:
    """A worker as the scheduler sees one: it records the tests it is sent."""

    def __init__(self, name: str):
        self.gateway = types.SimpleNamespace(id=name)
        self.shutting_down, self.sent = False, []

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


class _Quiet:
    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return None


def _first_shares(order: list, workers: int) -> list:
    """The tests xdist's WorkStealingScheduling sends each worker at the start."""
    tx = [f"{workers}*popen"]  # what `-n workers` sets
    config = types.SimpleNamespace(option=types.SimpleNamespace(tx=tx), getvalue={"tx": tx}.get)
    sched = xdist_worksteal.WorkStealingScheduling(config, log=_Quiet())
    nodes = [_Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, order)
    sched.schedule()
    return [[order[i] for i in node.sent] for node in nodes]


@pytest.mark.parametrize("workers,n_slow,n_rest", [(2, 67, 1390), (2, 5, 3), (3, 7, 20), (2, 9, 0), (4, 3, 1)])
def test_each_worker_starts_with_its_share_of_the_slow_tests(workers, n_slow, n_rest):
    slow, rest = [f"slow{i}" for i in range(n_slow)], [f"rest{i}" for i in range(n_rest)]
    order = dealt_order(slow, rest, workers)
    assert sorted(order) == sorted(slow + rest)
    assert [t for t in order if t in rest] == rest  # the rest keep their order
    shares = _first_shares(order, workers)
    assert sorted(sum(shares, [])) == sorted(order)
    counts = []
    for share in shares:
        kinds = [t.startswith("slow") for t in share]
        assert kinds == sorted(kinds, reverse=True), share  # a worker's slow tests come first
        counts.append(sum(kinds))
    assert max(counts) - min(counts) <= 1, counts  # and each has its share of them


def test_one_worker_runs_the_slow_tests_first_in_file_order():
    assert dealt_order(["s1", "s2"], ["r1", "r2", "r3"], 1) == ["s1", "s2", "r1", "r2", "r3"]


def test_the_suite_command_schedules_by_work_stealing():
    lines = [line for line in open(os.path.join(ROOT, "launch", "dev.sh")) if "-m pytest" in line]
    assert lines and all("-n 2 --dist worksteal" in line for line in lines), lines
