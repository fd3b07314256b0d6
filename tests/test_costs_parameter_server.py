"""Data parallelism through parameter servers: the push-pull closed form, its inputs
checked, and a step that uses it end to end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import simulate
from llmsim.costs import HardwareCosts
from llmsim.costs.parameter_server import server_link_bytes
from llmsim.errors import UserError
from llmsim.ops import CommOp
from llmsim.plan import Plan
from tests.helpers import make_scenario

PS = {"parallelism.dp_mode": "parameter_server", "parallelism.pp": 1, "parallelism.tp": 1,
      "parallelism.zero": 0, "nodes": 4, "training.global_batch": 64}


def _costs(servers: int) -> tuple[HardwareCosts, object]:
    scenario = make_scenario(**PS, **{"parallelism.parameter_servers": servers})
    plan = Plan.from_scenario(scenario)
    return HardwareCosts.from_scenario(scenario, plan), scenario


def test_server_link_bytes_is_its_share_of_every_push_plus_its_node_s_own() -> None:
    # 32 pushers, 4 servers, 8 devices per node, 1 MB buckets: 8 MB + 8 MB each way.
    assert server_link_bytes(1e6, 32, 4, 8) == 16e6


@pytest.mark.parametrize("servers", [1, 2, 4])
def test_push_pull_time_is_two_crossings_of_the_busiest_server_link(servers: int) -> None:
    costs, scenario = _costs(servers)
    system = scenario.system
    node, network = system.node, system.network
    dp = scenario.dp  # tp = pp = 1: every device of the job pushes each bucket
    assert dp == 4 * node.devices_per_node
    bucket = 25e6
    link = (dp / servers + node.devices_per_node) * bucket
    latency = (network.step_latency_us
               + network.hop_latency_us * network.hops(4, system.nodes)) * 1e-6
    expected = (2 * (link / (node.injection_bytes_per_s * network.efficiency) + latency)
                + node.accelerator.kernel_launch_us * 1e-6)
    op = CommOp("dp_ps_c0_b0", "push_pull", "dp", "W", bucket)
    assert costs.comm_s(op) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.floats(1e3, 1e9))
def test_more_servers_cost_less_down_to_the_workers_own_traffic(bucket: float) -> None:
    times = [_costs(s)[0].comm_s(CommOp("b", "push_pull", "dp", "W", bucket)) for s in (1, 2, 4)]
    assert times[0] > times[1] > times[2]
    # Affine in 1/S: the server share halves from 1 to 2 servers and again from 2 to 4.
    assert times[0] - times[1] == pytest.approx(2 * (times[1] - times[2]), rel=1e-9)


def test_a_step_through_parameter_servers_pushes_every_bucket() -> None:
    ps = simulate(make_scenario(**PS, **{"parallelism.parameter_servers": 1}))
    many = simulate(make_scenario(**PS, **{"parallelism.parameter_servers": 4}))
    names = {r.name for r in ps.trace.records if r.stream == "dp"}
    assert names and all(name.startswith("dp_ps_") for name in names)
    assert ps.step_time_s > many.step_time_s


@pytest.mark.parametrize(("changes", "message"), [
    ({"parallelism.parameter_servers": 5}, "at most 4"),
    ({"parallelism.zero": 1}, "set zero to 0"),
])
def test_bad_parameter_server_settings_are_one_sentence_errors(changes: dict,
                                                               message: str) -> None:
    with pytest.raises(UserError, match=message):
        simulate(make_scenario(**{**PS, **changes}))
