"""Slurm's environment read as TensorFlow's ``SlurmClusterResolver`` reads it (``launchers``)."""

from __future__ import annotations

import pytest

from tf_grpc_bench import launchers
from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay.placement import cluster
from tf_grpc_bench.replay.placement.cluster import Role


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("vm", ("vm",)),
        ("a,b", ("a", "b")),
        # TensorFlow's own docstring example.
        ("n[1-2],m5,o[3-4,6,7-9]", ("n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9")),
        ("node[08-11]", ("node08", "node09", "node10", "node11")),
        ("node[098-101]", ("node098", "node099", "node100", "node101")),
        ("node[9-10]", ("node9", "node10")),
        ("gpu[1,3],cpu[001-002]", ("gpu1", "gpu3", "cpu001", "cpu002")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("node[3]-ib", ("node3-ib",)),
        ("c1.cluster,c2.cluster", ("c1.cluster", "c2.cluster")),
    ],
)
def test_hostlists_expand_in_slurms_order_with_padding_kept(
    text: str, hosts: tuple[str, ...]
) -> None:
    assert launchers.expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "empty"),
        ("n[1-", "'[' without ']'"),
        ("n1-]", "']' without '['"),
        ("n[[1]]", "nested"),
        ("n[3-1]", "goes down"),
        ("n[a-b]", "expected numbers"),
        ("n[]", "expected numbers"),
        ("n[1,]", "expected numbers"),
        ("n[1-2],,m", "empty host"),
        ("n[0-99999999]", "more than"),
    ],
)
def test_a_malformed_hostlist_is_one_line_naming_the_variable(text: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match="SLURM_STEP_NODELIST") as error:
        launchers.expand_hostlist(text)
    assert complaint in str(error.value)


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("5", (5,)),
        ("2(x3),1", (2, 2, 2, 1)),
        ("1,2(x2)", (1, 2, 2)),
        ("3(x1)", (3,)),
    ],
)
def test_tasks_per_node_expand_repeats(text: str, counts: tuple[int, ...]) -> None:
    assert launchers.expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(x0)", "2(3)", "-1", "2(x2)1"])
def test_malformed_tasks_per_node_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="SLURM_STEP_TASKS_PER_NODE"):
        launchers.expand_tasks_per_node(text)


def test_jobs_are_sorted_by_name_as_tensorflow_hands_out_ranks() -> None:
    assert launchers.parse_jobs("ps:2,worker:2,chief:1") == (
        ("chief", 1),
        ("ps", 2),
        ("worker", 2),
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("ps:1,trainer:2", "'trainer' is not one of"),
        ("ps:1,ps:2", "given twice"),
        ("ps:0,worker:1", "task count >= 1"),
        ("ps,worker:1", "task count >= 1"),
        ("ps:1,worker:1,chief:2", "at most one chief"),
    ],
)
def test_bad_jobs_are_one_line_naming_the_flag(text: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match="--slurm-jobs") as error:
        launchers.parse_jobs(text)
    assert complaint in str(error.value)


def srun_environment(rank: int, **overrides: str) -> dict[str, str]:
    """What srun gives task ``rank`` of ``srun -N 3 -n 5`` on node[1-3] (2, 2 and 1 tasks)."""
    nodes = ["node1", "node1", "node2", "node2", "node3"]
    environ = {
        "SLURM_PROCID": str(rank),
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_NTASKS": "5",
        "SLURM_STEP_NODELIST": "node[1-3]",
        "SLURM_JOB_NODELIST": "node[1-3]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_LOCALID": str([0, 1, 0, 1, 0][rank]),
        "SLURMD_NODENAME": nodes[rank],
    }
    return {**environ, **overrides}


def test_ranks_take_each_nodes_ports_in_order_and_jobs_take_ranks_in_name_order() -> None:
    jobs = launchers.parse_jobs("ps:2,worker:2,chief:1")
    tasks = [
        launchers.slurm_placement(
            launchers.read_slurm_step(srun_environment(rank)), jobs, port_base=2222
        )
        for rank in range(5)
    ]
    assert tasks[0].cluster_dict() == {
        "chief": ["node1:2222"],
        "ps": ["node1:2223", "node2:2222"],
        "worker": ["node2:2223", "node3:2222"],
    }
    assert all(t.cluster == tasks[0].cluster for t in tasks)
    assert [(t.job, t.index) for t in tasks] == [
        ("chief", 0),
        ("ps", 0),
        ("ps", 1),
        ("worker", 0),
        ("worker", 1),
    ]


def test_job_counts_must_add_up_to_the_step() -> None:
    step = launchers.read_slurm_step(srun_environment(0))
    with pytest.raises(ConfigError, match=r"ps:1,worker:2: 3 tasks, but the Slurm step has 5"):
        launchers.slurm_placement(step, launchers.parse_jobs("ps:1,worker:2"))


def test_a_cyclic_distribution_is_caught_by_the_tasks_own_node_and_local_id() -> None:
    # srun -m cyclic puts rank 1 on node2 as its first task there.
    step = launchers.read_slurm_step(
        srun_environment(1, SLURMD_NODENAME="node2", SLURM_LOCALID="0")
    )
    with pytest.raises(ConfigError, match="--distribution=block"):
        launchers.slurm_placement(step, launchers.parse_jobs("ps:2,worker:2,chief:1"))


def test_the_job_variables_serve_when_the_step_ones_are_missing() -> None:
    environ = srun_environment(4)
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE"):
        del environ[name]
    step = launchers.read_slurm_step(environ)
    assert step.nodes == ("node1", "node2", "node3")
    assert step.tasks_per_node == (2, 2, 1)
    assert (step.rank, step.task_count, step.local_id, step.node_name) == (4, 5, 0, "node3")


def test_a_batch_script_is_not_a_step_task() -> None:
    # What sbatch gives its script (seen under Slurm 22.05): no step id.
    batch = {
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "3",
        "SLURM_JOB_NODELIST": "vm",
        "SLURM_TASKS_PER_NODE": "3",
    }
    assert not launchers.in_slurm_step(batch)
    with pytest.raises(ConfigError, match="start the tasks with srun"):
        launchers.read_slurm_step(batch)


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID: expected an integer"),
        ({"SLURM_STEP_NUM_TASKS": "4"}, "add up to 5, not 4 tasks"),
        ({"SLURM_STEP_NODELIST": "node[1-2]"}, "2 nodes but tasks per node for 3"),
        ({"SLURM_PROCID": "5"}, "rank 5 is not in 0..4"),
    ],
)
def test_an_inconsistent_environment_is_one_line(overrides: dict[str, str], complaint: str) -> None:
    with pytest.raises(ConfigError) as error:
        launchers.read_slurm_step(srun_environment(0, **overrides))
    assert complaint in str(error.value)


def test_ports_past_65535_are_refused() -> None:
    step = launchers.read_slurm_step(srun_environment(0))
    with pytest.raises(ConfigError, match="--port-base 65535"):
        launchers.slurm_addresses(step, 65535)


def test_role_placement_under_srun_gives_each_rank_its_part() -> None:
    roles = [
        cluster.resolve_placement(
            slurm_jobs="ps:2,worker:2,chief:1",
            port_base=2222,
            environ={**srun_environment(rank), "TF_CONFIG": "ignored: --slurm-jobs wins"},
        )
        for rank in range(5)
    ]
    assert [p.roles if p else None for p in roles] == [
        frozenset({Role.GATHER}),
        frozenset({Role.SERVE}),
        frozenset({Role.SERVE}),
        frozenset({Role.REPLAY}),
        frozenset({Role.REPLAY}),
    ]
    assert roles[3] is not None and roles[3].gatherer_address == "node1:2222"
    assert roles[3].ps_addresses == ("node1:2223", "node2:2222")


def test_slurm_jobs_without_a_ps_or_with_cluster_flags_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least one ps"):
        cluster.resolve_placement(slurm_jobs="worker:5", environ=srun_environment(0))
    with pytest.raises(UsageError, match="drop --cluster"):
        cluster.resolve_placement(
            slurm_jobs="ps:1,worker:4", task="ps:0", environ=srun_environment(0)
        )


@pytest.mark.tensorflow
def test_the_layout_is_tensorflows_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorFlow's resolver, given the same step, lays out the same cluster."""
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

    jobs = {"ps": 2, "worker": 3, "chief": 1}
    for rank in range(6):
        environ = {
            "SLURM_PROCID": str(rank),
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": "6",
            "SLURM_STEP_NODELIST": "gpu[08-10]",
            "SLURM_STEP_TASKS_PER_NODE": "3,2,1",
        }
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        resolver = slurm_cluster_resolver.SlurmClusterResolver(
            jobs=jobs, port_base=7000, gpus_per_node=8, gpus_per_task=1, auto_set_gpu=False
        )
        theirs = resolver.cluster_spec().as_dict()
        ours = launchers.slurm_placement(
            launchers.read_slurm_step(environ),
            launchers.parse_jobs("ps:2,worker:3,chief:1"),
            port_base=7000,
        )
        assert ours.cluster_dict() == theirs
        assert (ours.job, ours.index) == resolver.get_task_info()
