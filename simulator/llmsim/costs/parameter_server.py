"""Synchronous data parallelism through parameter servers: push a gradient bucket, pull
its sum (Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter
Server", OSDI, §3 push/pull; MXNet's ``dist_sync`` kvstore with ``update_on_kvstore=False``,
where the workers run the optimizer on the pulled sums).

``S`` server processes sit on the first ``S`` nodes of the job, one per node, and each
gets ``1/S`` of every bucket (a key range, Li et al. §3.1). All the devices that reduce
the same bucket at the same moment — the ``k = dp·tp`` devices of one pipeline stage
(the stages reach their buckets at different times) — push together, so a server's
network link carries ``k·B/S`` bytes each way per bucket of ``B`` bytes, and its node's
own ``d`` devices push and pull ``d·B`` bytes besides (upper bound: also the parts for
the server on the node itself, which need not leave it). Push, then pull, each at the
node's injection bandwidth times the network's large-message efficiency:

    t = 2 · ((k/S + d) · B / (I · η) + latency) + launch

where the latency is one crossing of the job's network (its switch hops and the
collective step latency); a worker node without a server moves ``d·B`` and waits for
the servers. The sum on the server (one add per pushed element) is memory-bound and
left out.
"""

from __future__ import annotations

from llmsim.errors import UserError
from llmsim.plan import Plan
from llmsim.specs import System


def server_link_bytes(bucket_bytes: float, pushers: int, servers: int,
                      devices_per_node: int) -> float:
    """Bytes one server node's link carries in each direction per bucket: its share of
    every pusher's bucket, plus its own devices' whole buckets."""
    return pushers * bucket_bytes / servers + devices_per_node * bucket_bytes


class ParameterServerModel:
    """Prices the push-pull of a gradient bucket on a plan's machine."""

    def __init__(self, system: System, plan: Plan, servers: int,
                 launch_s: float = 0.0) -> None:
        if servers > plan.nodes:
            raise UserError(
                f"parallelism.parameter_servers: {servers} servers on a job of {plan.nodes} "
                "nodes; the servers run one per node of the job, so use at most "
                f"{plan.nodes}"
            )
        network, node = system.network, system.node
        self.servers = servers
        self.pushers = plan.degrees["dp"] * plan.degrees["tp"]
        self.devices_per_node = node.devices_per_node
        self.bytes_per_s = node.injection_bytes_per_s * network.efficiency
        self.latency_s = (network.step_latency_us
                          + network.hop_latency_us * network.hops(plan.nodes, system.nodes)
                          ) * 1e-6
        self.launch_s = launch_s

    def comm_s(self, bucket_bytes: float) -> float:
        """Seconds to push a bucket of ``bucket_bytes`` and pull its sum back."""
        if bucket_bytes <= 0:
            return 0.0
        link = server_link_bytes(bucket_bytes, self.pushers, self.servers,
                                 self.devices_per_node)
        return 2 * (link / self.bytes_per_s + self.latency_s) + self.launch_s
