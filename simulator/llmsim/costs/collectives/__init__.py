"""Collective cost model: α–β algorithms on the path a group actually uses.

A group of ``n`` ranks has ``k`` members on each of ``N`` nodes (from the Plan's
:class:`~llmsim.plan.GroupPlacement`). Its traffic uses two kinds of link:

* inside a node, the fabric tier that holds its ``span_devices`` consecutive devices:
  ``B_intra = gbps_per_direction × efficiency`` per device, step latency ``α_intra``;
* between nodes, its share of the node's network injection (a send/recv between two
  stages: see :attr:`GroupPath.sender_inter_bytes_per_s`; neighbours on one node use the
  fabric, at most what NCCL's channels for the pair carry, :func:`pair_fabric_bytes_per_s`):
  every group of the axis on
  the node runs at the same time, so a device owns ``1/devices_per_node`` of it and the
  group ``B_inter = node_bw × network.efficiency × taper × k/devices_per_node``, with step
  latency ``α_inter = step_latency + hop_latency × hops``. ``node_bw`` is the NIC
  injection bandwidth, on a torus the links the group's ring drives; ``taper`` and
  ``hops`` are the network topology's route of the group (:mod:`llmsim.costs.topology`),
  and a torus group spanning several dimensions can also run one ring per dimension
  (:func:`torus_s`). The path is built in :mod:`llmsim.costs.paths`. The step latencies
  of NVIDIA systems are NCCL's own tuning model (``tuning.cc`` ``hwLat``, Ring with the
  Simple protocol that carries large messages).

Each algorithm gives a time; like NCCL's tuner (``src/graph/tuning.cc``,
``ncclTopoTuneModel``/``ncclTopoGetAlgoTime``), the fastest is taken per call, plus one
kernel launch. A system that names its library's own model (``network.collectives``, a
:class:`~llmsim.specs.CollectiveLibrary`) gets that tuner's algorithms and protocols
instead (:func:`library_times_s`). A measured nccl-tests table replaces the model
(:class:`CollectiveTable`).
See ``docs/cost-models.md`` for the derivations.

The parts: :mod:`~llmsim.costs.collectives.algorithms` (the α–β algorithms),
:mod:`~llmsim.costs.collectives.library` (a library's own tuner),
:mod:`~llmsim.costs.collectives.table` (measured tables) and
:mod:`~llmsim.costs.collectives.model` (:class:`CollectiveModel`, which picks among them).
A new algorithm is one function in ``algorithms.py`` and an entry in :data:`ALGORITHMS`.
"""

from llmsim.costs.collectives.algorithms import (
    ALGORITHMS,
    hierarchical_s,
    point_to_point_s,
    ring_s,
    ring_steps,
    torus_s,
    tree_s,
    volume_factor,
)
from llmsim.costs.collectives.library import library_ring_s, library_times_s, library_tree_s
from llmsim.costs.collectives.model import CollectiveModel, algorithm_times_s
from llmsim.costs.collectives.table import CollectiveTable
from llmsim.costs.paths import (
    INF,
    NCCL_P2P_NVL_CHUNK_BYTES,
    GroupPath,
    device_link_bytes_per_s,
    group_path,
    net_peer_channels,
    node_network_bytes_per_s,
    pair_fabric_bytes_per_s,
    pair_p2p_channels,
    posted_p2p_units,
)

__all__ = [
    "ALGORITHMS",
    "INF",
    "NCCL_P2P_NVL_CHUNK_BYTES",
    "CollectiveModel",
    "CollectiveTable",
    "GroupPath",
    "algorithm_times_s",
    "device_link_bytes_per_s",
    "group_path",
    "hierarchical_s",
    "library_ring_s",
    "library_times_s",
    "library_tree_s",
    "net_peer_channels",
    "node_network_bytes_per_s",
    "pair_fabric_bytes_per_s",
    "pair_p2p_channels",
    "point_to_point_s",
    "posted_p2p_units",
    "ring_s",
    "ring_steps",
    "torus_s",
    "tree_s",
    "volume_factor",
]
