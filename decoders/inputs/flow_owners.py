"""Which process owns each TCP connection, from the probes' socket events (decoders.formats.probe_events):
state changes delimit a connection on one socket address, connect() and accept() name its owner."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dlcsniff.decoders.formats.probe_events import (Kind, SockEvent, SocketSnapshot, TCP_CLOSE, TCP_CLOSE_WAIT,
                                                    TCP_ESTABLISHED, TCP_FIN_WAIT1, TCP_LAST_ACK, TCP_LISTEN,
                                                    TCP_SYN_RECV, TCP_SYN_SENT)

# the state changes close() and shutdown() make inside the calling task
_CLOSED_BY_THE_OWNER = {(TCP_ESTABLISHED, TCP_FIN_WAIT1), (TCP_CLOSE_WAIT, TCP_LAST_ACK)}


@dataclass(slots=True)
class Flow:
    """One TCP connection (or listening socket) of the watched namespace and the process that owns it.

    `source` says how the owner is known: "connect" (the task that called connect()), "accept" (the
    process whose accept() returned this peer), "listen" (the owner of the listening socket on the local
    port: accept() was not seen), "close" (the task that closed a connection made before the probes attached),
    or None."""
    skaddr: int
    family: int
    local_ip: str | None = None
    local_port: int = 0
    remote_ip: str | None = None
    remote_port: int = 0
    first_mono_ns: int = 0
    established_mono_ns: int | None = None
    closed_mono_ns: int | None = None
    state: int = 0
    active: bool | None = None      # True: connect()ed here, False: accepted here
    tgid: int | None = None
    tid: int | None = None
    comm: str | None = None
    cgroup_id: int | None = None
    source: str | None = None

    def take_owner(self, event: SockEvent, source: str) -> None:
        self.tgid, self.tid, self.comm, self.cgroup_id, self.source = (
            event.tgid, event.tid, event.comm, event.cgroup_id, source)


def attribute_flows(events: Iterable[SockEvent], open_at_start: Iterable[SocketSnapshot] = ()) -> list[Flow]:
    """The connections the socket events describe, each with its owning process where the events tell.

    State changes delimit a connection on one socket address (addresses are reused after close);
    ownership comes from connect() for connections made here, from accept() (by peer address) for
    connections accepted here, and failing that from the listener on the same local port, seen by the
    probes or already open at start (an accept() that was waiting when the probes started is not seen); for a
    connection made before the probes, from the close() that ended it."""
    flows: list[Flow] = []
    open_flows: dict[int, Flow] = {}
    accepts: list[SockEvent] = []
    for event in sorted(events, key=lambda e: e.mono_ns):
        if event.kind == Kind.SOCK_ACCEPT:
            accepts.append(event)
            continue
        flow = open_flows.get(event.skaddr)
        if flow is None:
            flow = Flow(event.skaddr, event.family, first_mono_ns=event.mono_ns)
            open_flows[event.skaddr] = flow
            flows.append(flow)
            flow.active = {TCP_SYN_SENT: True, TCP_SYN_RECV: False}.get(event.newstate)
        if event.local_port and (event.remote_port or event.newstate == TCP_LISTEN):
            flow.local_ip, flow.local_port = event.local_ip, event.local_port
            flow.remote_ip, flow.remote_port = event.remote_ip, event.remote_port
        flow.state = event.newstate
        if event.oldstate == TCP_CLOSE and event.newstate in (TCP_SYN_SENT, TCP_LISTEN):
            # connect() and listen() change the state inside the calling task
            flow.take_owner(event, "connect" if event.newstate == TCP_SYN_SENT else "listen")
        if flow.active is None and flow.tgid is None and (event.oldstate, event.newstate) in _CLOSED_BY_THE_OWNER:
            flow.take_owner(event, "close")
        if event.newstate == TCP_ESTABLISHED and flow.established_mono_ns is None:
            flow.established_mono_ns = event.mono_ns
        if event.newstate == TCP_CLOSE:
            flow.closed_mono_ns = event.mono_ns
            del open_flows[event.skaddr]
    # A socket closed before it had both ports (a failed connect) was never a flow.
    flows = [flow for flow in flows if flow.local_port]
    _attribute_accepts(flows, accepts)
    listening_at_start = [
        Flow(0, sock.family, sock.local_ip, sock.local_port, first_mono_ns=sock.mono_ns, state=sock.state,
             tgid=sock.tgid, comm=sock.comm) for sock in open_at_start if sock.state == TCP_LISTEN]
    _attribute_to_listeners(flows, listening_at_start)
    return flows


def _attribute_accepts(flows: list[Flow], accepts: list[SockEvent]) -> None:
    passive = {}
    for flow in flows:
        if flow.active is False and flow.source in (None, "listen"):
            passive.setdefault((flow.remote_ip, flow.remote_port), []).append(flow)
    for accept in accepts:
        candidates = [flow for flow in passive.get((accept.remote_ip, accept.remote_port), [])
                      if flow.first_mono_ns <= accept.mono_ns
                      and (flow.closed_mono_ns is None or accept.mono_ns <= flow.closed_mono_ns)]
        if candidates:
            candidates[-1].take_owner(accept, "accept")


def _attribute_to_listeners(flows: list[Flow], listening_at_start: list[Flow]) -> None:
    listeners = [flow for flow in flows if flow.state == TCP_LISTEN or flow.remote_port == 0 and flow.local_port]
    listeners += listening_at_start
    for flow in flows:
        if flow.active is not False or flow.source is not None:
            continue
        for listener in listeners:
            if (listener.local_port == flow.local_port and listener.tgid is not None
                    and listener.first_mono_ns <= flow.first_mono_ns
                    and (listener.closed_mono_ns is None or flow.first_mono_ns <= listener.closed_mono_ns)):
                flow.tgid, flow.comm, flow.cgroup_id, flow.source = (
                    listener.tgid, listener.comm, listener.cgroup_id, "listen")
                break
