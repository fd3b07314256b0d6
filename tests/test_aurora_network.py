"""Aurora's Slingshot global links against the system paper's figures.

Ibeid et al., "Scaling MPI Applications on Aurora" (arXiv:2512.04291): 166 compute groups
of 32 switches with 2 nodes each, joined all-to-all by two global links per pair of
groups, 1.38 PB/s of global bandwidth. ``hardware/systems/aurora.yaml`` derives its taper
from them the way Frontier's is derived (injection of a group over its global links).
"""

from __future__ import annotations

import pytest

from llmsim.loader import load_spec

COMPUTE_GROUPS = 166
LINKS_PER_PAIR = 2
GLOBAL_BYTES_PER_S = 1.38e15  # the paper's global bandwidth, both directions


def test_groups_are_racks_of_64_nodes_with_two_links_per_pair() -> None:
    net = load_spec("systems", "aurora").network
    assert net.nodes_per_group == 32 * 2
    assert net.global_links_per_group_pair == LINKS_PER_PAIR


def test_taper_is_a_groups_injection_over_its_global_links() -> None:
    aurora = load_spec("systems", "aurora")
    node, net = aurora.node, aurora.network
    injection_gbit = net.nodes_per_group * node.nics_per_node * node.nic_gbit
    global_gbit = (COMPUTE_GROUPS - 1) * LINKS_PER_PAIR * node.nic_gbit
    assert net.global_taper == pytest.approx(injection_gbit / global_gbit, rel=1e-3)


def test_the_links_add_up_to_the_papers_global_bandwidth() -> None:
    node = load_spec("systems", "aurora").node
    pairs = COMPUTE_GROUPS * (COMPUTE_GROUPS - 1) // 2
    both_directions = pairs * LINKS_PER_PAIR * node.nic_gbit * 1e9 / 8 * 2
    assert both_directions == pytest.approx(GLOBAL_BYTES_PER_S, rel=0.01)
