"""The replay's network on SimGrid (Debian's python3-simgrid, 3.32): flow-level TCP.

Every node is a host on a star (SimGrid's star zone): its own link to a non-blocking switch, one each way
(`links.up_bit_s[node]`, `links.down_bit_s[node]`, half the one-way latency on each), behind a link of the
host's own limit, shared by both ways, when the calibration found one. A message is a host-to-host
communication (s4u Comm::sendto_async) of its size; concurrent transfers share the links as SimGrid's LV08
model shares them (max-min fairness with TCP's RTT bias, the latency factor of TCP's slow start; validated
against packet-level TCP in SimGrid's literature), except two of its settings: the bandwidth factor is what a TCP
payload gets of an Ethernet link (`efficiency`, MSS over frame bytes) rather than LV08's 0.97, and the reverse
traffic of acknowledgements (LV08's cross-traffic, 5 % of the flow) is left out: the calibration measured
payload rates with the real acknowledgements on the wire.

The replay runs in one controller actor, which starts the transfers and waits for whichever ends first
(Comm::wait_any_for), up to the replay's next timer. simgrid is imported here only, when a simulation runs.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from dlcsniff.analysis.simulate_network import UNLIMITED_BIT_S, Links
from dlcsniff.analysis.simulate_replay import ReplayError

SWITCH_ZONE = "switch"
CONTROLLER_SPEED_FLOPS = 1e9       # the controller actor's host computes nothing


class _SimgridNetwork:
    def __init__(self, simgrid, hosts: list) -> None:
        self._sg = simgrid
        self._hosts = hosts
        self._comms: list = []
        self._messages: list[int] = []

    def now(self) -> float:
        return self._sg.Engine.clock

    def start(self, message: int, src: int, dst: int, size_bytes: float) -> None:
        self._comms.append(self._sg.Comm.sendto_async(self._hosts[src], self._hosts[dst], max(int(size_bytes), 1)))
        self._messages.append(message)

    def advance(self, until_s: float) -> list[tuple[int, float]]:
        if not self._comms:
            if math.isinf(until_s):
                return []
            self._sg.this_actor.sleep_until(until_s)
            return []
        timeout = -1.0 if math.isinf(until_s) else max(until_s - self.now(), 0.0)
        index = self._sg.Comm.wait_any_for(self._comms, timeout)
        if index < 0:
            return []
        self._comms.pop(index)
        return [(self._messages.pop(index), self.now())]


def run(links: Links, replay: Callable[[_SimgridNetwork], object]):
    """Build the star of `links`, run `replay(network)` in a controller actor, and return what it returned."""
    try:
        import simgrid
    except ImportError as exc:
        raise ReplayError("SimGrid's Python module is missing (`make setup` installs Debian's python3-simgrid "
                          f"and links it into the venv): {exc}") from None
    # The engine is a process-wide singleton in SimGrid: one simulation per process.
    if getattr(simgrid.Engine, "_dlcsniff_used", False):
        raise ReplayError("SimGrid runs one simulation per process")
    engine = simgrid.Engine(["dlcsniff", "--cfg=network/model:LV08", "--cfg=network/crosstraffic:0",
                             f"--cfg=network/bandwidth-factor:{links.efficiency}", "--log=root.thres:critical"])
    simgrid.Engine._dlcsniff_used = True
    zone = simgrid.NetZone.create_star_zone(SWITCH_ZONE)
    hosts = []
    for node in range(len(links.up_bit_s)):
        host = zone.create_host(f"node{node}", CONTROLLER_SPEED_FLOPS).seal()
        up, down = (zone.create_link(f"{way}{node}", float(rate) / 8).set_latency(links.latency_s / 2).seal()
                    for way, rate in (("up", links.up_bit_s[node]), ("down", links.down_bit_s[node])))
        to_switch, from_switch = [simgrid.LinkInRoute(up)], [simgrid.LinkInRoute(down)]
        if links.host_bit_s[node] < UNLIMITED_BIT_S:
            # the host's own limit, shared by what it sends and what it receives
            limit = zone.create_link(f"host{node}", float(links.host_bit_s[node]) / 8).seal()
            to_switch.insert(0, simgrid.LinkInRoute(limit))
            from_switch.append(simgrid.LinkInRoute(limit))
        zone.add_route(host.netpoint, None, None, None, to_switch, False)
        zone.add_route(None, host.netpoint, None, None, from_switch, False)
        hosts.append(host)
    zone.seal()
    result = {}

    def controller() -> None:
        # an exception must not leave the actor: SimGrid aborts the process on one
        try:
            result["value"] = replay(_SimgridNetwork(simgrid, hosts))
        except Exception as exc:
            result["error"] = exc

    simgrid.Actor.create("replay", hosts[0], controller)
    engine.run()
    if "error" in result:
        raise result["error"]
    if "value" not in result:
        raise ReplayError("the SimGrid simulation ended before the replay did")
    return result["value"]
