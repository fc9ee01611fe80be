"""Gloo (PyTorch's CPU collectives) in a capture: its pair connections (the transport, decoders.protocols.gloo.wire)
and PyTorch's TCPStore rendezvous (decoders.protocols.tcpstore.decoder).

`GlooCaptureDecoder` is the protocol decoder the capture decoder drives (decoders.protocols.base): it claims
Gloo pairs and TCPStore connections, resolves ranks from the rendezvous at the end of the capture, and hands
back message and stream rows, and each direction's sequence space, from which the job step
(decoders.protocols.gloo.job) builds the collectives.

What a lossy capture keeps is enough:
- Sizes: a collective's tensor is the one whose gloo schedule (decoders.protocols.gloo.model) agrees with every
  length its messages state (each transfer is stated three times: NOTIFY_SEND_READY, NOTIFY_RECV_READY, the
  data preamble) and with the bytes its TCP sequence space counts on each direction (`decoders.protocols.gloo.sizes`:
  lost segments are counted there, so they shrink nothing). Captured payload bytes play no part.
- Ranks: what the rendezvous left unknown comes from the connect sequence numbers (ranks in torch 2.13),
  the capturing host's address (on every connection; the link layer names it where the rendezvous cannot,
  as with two ranks), elimination, and the peer structure of the collectives (`_ranks_from_traffic`).
- Directions whose first bytes were lost are still claimed: the other half of a Gloo pair, or a TCPStore
  client by a request naming a key.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from dlcsniff.decoders.protocols.gloo import job as gloo_job, model as gloo_model
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.packet import ip_to_str
from dlcsniff.decoders.protocols.tcpstore import decoder as tcpstore
from dlcsniff.decoders.protocols.base import CaptureRows, LossCounter, ProtocolDecoderBase, TcpDirection
from dlcsniff.decoders.protocols.gloo.wire import (CONNECT_SEQUENCE, MAX_RANKS, MAX_SEQUENCE_NUMBER, P2P,
                                                   PREAMBLE_BYTES, GlooMessage, GlooStreamDecoder, Opcode, PairConnect,
                                                   RankRecord, could_be_sequence_or_preamble, is_preamble,
                                                   parse_rank_record, parse_slot, split_rank_key)
from dlcsniff.decoders.sansio import NEED_DATA, StreamDecoder
from dlcsniff.decoders.tcp import StreamKey

Endpoint = tuple[bytes, int]
CLAIM_PREFIX_BYTES = CONNECT_SEQUENCE.size + PREAMBLE_BYTES     # enough to tell both roles apart


class Role(enum.Enum):
    INITIATOR = "initiator"              # the connecting side: starts with the sequence number
    LISTENER = "listener"
    UNKNOWN = "unknown"                  # a capture that started mid-connection, on an unknown pair


_OTHER_ROLE = {Role.INITIATOR: Role.LISTENER, Role.LISTENER: Role.INITIATOR, Role.UNKNOWN: Role.UNKNOWN}


@dataclass(slots=True)
class _GlooStream:
    key: StreamKey
    role: Role
    decoder: GlooStreamDecoder
    sequence_number: int | None = None
    messages: list[GlooMessage] = field(default_factory=list)


@dataclass(slots=True)
class _StoreConnection:
    client_stream_id: int                # the request direction names the connection in the rows
    decoder: tcpstore.TcpStoreConnection
    open_directions: int = 1             # claimed and not ended: responses may follow the client's FIN

    def direction(self, is_client: bool) -> StreamDecoder:
        return self.decoder.requests if is_client else self.decoder.responses

    def end(self, ts_ns: int) -> None:
        """Both directions are over (a direction never claimed ends with the other)."""
        self.open_directions = 0
        self.decoder.requests.receive_end(ts_ns)
        self.decoder.responses.receive_end(ts_ns)


@dataclass(slots=True)
class _Pair:
    """What the rendezvous says about one Gloo connection's ends."""
    group: str | None
    ranks: dict[Endpoint, int]


class GlooCaptureDecoder(ProtocolDecoderBase):
    """Gloo pair connections and the TCPStore rendezvous of one capture file (sans-IO; see module doc).

    Message rows: protocol "gloo" (one per Gloo message) and "tcpstore" (one per store query with its
    response). Ranks come from the rendezvous records seen in the same capture; without them ranks stay
    null and the capturing node is the address common to all its Gloo connections.
    """

    name = "gloo"
    losses = {"gloo": (LossCounter("lost_bytes", "B skipped to find the Gloo framing again"),),
              "tcpstore": (LossCounter("lost_bytes", "B of store queries not decoded"),)}

    def __init__(self):
        super().__init__()
        self._gloo: dict[int, _GlooStream] = {}
        self._gloo_by_key: dict[StreamKey, _GlooStream] = {}
        self._store: dict[int, tuple[_StoreConnection, bool]] = {}     # stream -> connection, is the client
        self._store_clients: dict[StreamKey, _StoreConnection] = {}
        self._store_rows: list[dict] = []
        self._records: dict[tuple[str, int], RankRecord] = {}
        self._host_addresses: frozenset[bytes] = frozenset()

    # -- decoders.protocols.base API --------------------------------------------------------------
    def receive_capturing_host(self, addresses: frozenset[bytes]) -> None:
        """The local end of a connection the rendezvous cannot place (a two-rank job has a single Gloo
        connection)."""
        self._host_addresses = addresses

    def claim(self, direction: TcpDirection, prefix: bytes) -> bool | None:
        stream_id, key, syn_seen = direction.stream_id, direction.key, direction.syn_seen
        prefix = bytes(prefix)
        connection = self._store_clients.get((key[2], key[3], key[0], key[1]))
        if connection is not None:                    # the store's answers to a client already claimed
            connection.open_directions += 1
            self._store[stream_id] = (connection, False)
            return True
        validate = tcpstore.VALIDATE_PREFIX
        gloo_peer = (key[2], key[3], key[0], key[1]) in self._gloo_by_key
        if syn_seen and prefix[:len(validate)] == validate[:len(prefix)]:
            if len(prefix) < len(validate):
                return None
            store = True
        else:
            # Without its start (lost, or before the capture) a client shows by a request naming a key.
            store = False if syn_seen or gloo_peer else tcpstore.looks_like_request(prefix)
        if store:
            connection = _StoreConnection(stream_id, tcpstore.TcpStoreConnection(midstream=not syn_seen))
            self._store[stream_id] = (connection, True)
            self._store_clients[key] = connection
            return True
        reverse = self._gloo_by_key.get((key[2], key[3], key[0], key[1]))
        if reverse is not None:
            # The other half of a Gloo pair (claimed whatever this direction's first bytes: the capture may
            # have lost them, and the decoder then resynchronises on the first preamble it finds).
            role = _OTHER_ROLE[reverse.role]
        else:
            role = self._gloo_role(key, syn_seen, prefix)
            if not isinstance(role, Role):
                return None if store is None and role is False else role
        decoder = GlooStreamDecoder(initiator=role is Role.INITIATOR, midstream=role is Role.UNKNOWN)
        self._gloo[stream_id] = self._gloo_by_key[key] = _GlooStream(key, role, decoder)
        return True

    def receive_data(self, stream_id: int, data: memoryview, ts_ns: int) -> None:
        stream = self._gloo.get(stream_id)
        if stream is not None:
            stream.decoder.receive_data(data, ts_ns)
            self._take_gloo_events(stream)
            return
        connection, is_client = self._store[stream_id]
        connection.direction(is_client).receive_data(data, ts_ns)
        self._take_exchanges(connection)

    def receive_gap(self, stream_id: int, size: int, ts_ns: int, lost: bool) -> None:
        stream = self._gloo.get(stream_id)
        if stream is not None:
            stream.decoder.receive_gap(size, ts_ns, lost=lost)
            self._take_gloo_events(stream)
            return
        connection, is_client = self._store[stream_id]
        connection.direction(is_client).receive_gap(size, ts_ns, lost=lost)
        self._take_exchanges(connection)

    def receive_end(self, stream_id: int, ts_ns: int) -> None:
        stream = self._gloo.get(stream_id)
        if stream is not None:
            stream.decoder.receive_end(ts_ns)
            self._take_gloo_events(stream)
            return
        connection, is_client = self._store[stream_id]
        connection.direction(is_client).receive_end(ts_ns)
        connection.open_directions -= 1
        if not connection.open_directions:
            connection.end(ts_ns)
        self._take_exchanges(connection)

    def skippable_bytes(self, stream_id: int) -> int:
        stream = self._gloo.get(stream_id)
        return 0 if stream is None else stream.decoder.skippable_bytes()

    def skip(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None:
        self._gloo[stream_id].decoder.skip(size, ts_ns, cut)

    def end_of_capture(self) -> None:
        self._emit_rows(self._rows())

    def _rows(self) -> CaptureRows:
        for connection in self._store_clients.values():
            if connection.open_directions:
                connection.end(0)
                self._take_exchanges(connection)
        pairs = self._resolve_pairs()
        _, local_ip = self._local_node(pairs)
        self._complete_ranks(pairs, local_ip)
        self._ranks_from_traffic(pairs, local_ip)
        local_rank, local_ip = self._local_node(pairs)
        rows = CaptureRows()
        spaces = rows.tables.setdefault(gloo_job.SEQUENCE_SPACE, [])
        for stream_id, stream in self._gloo.items():
            pair = pairs[_connection(stream.key)]
            src, dst = (stream.key[0], stream.key[1]), (stream.key[2], stream.key[3])
            src_rank, dst_rank = pair.ranks.get(src), pair.ranks.get(dst)
            group_local = local_rank.get(pair.group)
            if group_local is not None:
                outgoing = src_rank == group_local
            else:
                outgoing = None if local_ip is None else src[0] == local_ip
            peer = None if outgoing is None else dst if outgoing else src
            context = {"src_rank": src_rank, "dst_rank": dst_rank, "local_rank": group_local, "outgoing": outgoing,
                       "peer_rank": pair.ranks.get(peer), "peer_address": peer and _address(peer),
                       "world_size": self._world_size(pair.group, pairs), "pg": pair.group}
            rows.messages.extend(_message_row(stream_id, message, context) for message in stream.messages)
            spaces.extend(_sequence_space_rows(stream_id, stream, context))
            decoder = stream.decoder
            rows.streams[stream_id] = {"protocol": "gloo", "gloo_role": stream.role.value,
                                       "pair_sequence": stream.sequence_number, "rank": src_rank,
                                       "peer_rank": dst_rank, "lost_bytes": decoder.lost_bytes,
                                       "resyncs": decoder.resyncs, "decode_error": decoder.last_resync_reason}
        for stream_id, (connection, is_client) in self._store.items():
            rows.streams[stream_id] = {"protocol": "tcpstore", "decode_error": connection.decoder.failed,
                                       # the connection's lost bytes, counted once, on the client's row
                                       "lost_bytes": connection.decoder.lost_bytes if is_client else None}
        rows.messages.extend(self._store_rows)
        return rows

    # -- Gloo streams -----------------------------------------------------------------------------
    def _listeners(self) -> dict[Endpoint, tuple[str, int]]:
        return {(record.ip, record.port): key for key, record in self._records.items()}

    def _gloo_role(self, key: StreamKey, syn_seen: bool, prefix: bytes) -> Role | bool | None:
        listeners = self._listeners()
        if (key[2], key[3]) in listeners:
            return Role.INITIATOR if syn_seen else Role.UNKNOWN
        if (key[0], key[1]) in listeners:
            return Role.LISTENER if syn_seen else Role.UNKNOWN
        if len(prefix) >= PREAMBLE_BYTES and is_preamble(prefix, 0):
            return Role.LISTENER if syn_seen else Role.UNKNOWN
        if not syn_seen:     # caught mid-connection: claimed if a message starts within the first bytes
            starts = range(len(prefix) - PREAMBLE_BYTES + 1)
            return Role.UNKNOWN if any(is_preamble(prefix, start) for start in starts) else (
                None if len(prefix) < CLAIM_PREFIX_BYTES else False)
        if len(prefix) >= CLAIM_PREFIX_BYTES:
            sequence_number = CONNECT_SEQUENCE.unpack_from(prefix, 0)[0]
            return Role.INITIATOR if syn_seen and 0 <= sequence_number < MAX_SEQUENCE_NUMBER \
                and is_preamble(prefix, CONNECT_SEQUENCE.size) else False
        return None if could_be_sequence_or_preamble(prefix) else False

    @staticmethod
    def _take_gloo_events(stream: _GlooStream) -> None:
        while (event := stream.decoder.next_event()) is not NEED_DATA:
            if event.__class__ is GlooMessage:
                stream.messages.append(event)
            elif event.__class__ is PairConnect:
                stream.sequence_number = event.sequence_number

    def _resolve_pairs(self) -> dict[tuple[Endpoint, Endpoint], _Pair]:
        """Each connection's group and the ranks of its ends, as far as the rendezvous tells.

        The listening end is found by its published address and the connecting end by the sequence number
        it sent. A connection whose listener was not seen published (the capture lost that part of the
        rendezvous) belongs to the capture's only group, if it has one, and its ends are the ranks
        published with their addresses, when each address has one rank."""
        listeners = self._listeners()
        groups = {group for group, _ in self._records}
        sole_group = next(iter(groups)) if len(groups) == 1 else None
        sequence_numbers: dict[tuple[Endpoint, Endpoint], int] = {}
        for stream in self._gloo.values():
            if stream.sequence_number is not None:
                sequence_numbers[_connection(stream.key)] = stream.sequence_number
        pairs: dict[tuple[Endpoint, Endpoint], _Pair] = {}
        for stream in self._gloo.values():
            connection = _connection(stream.key)
            if connection in pairs:
                continue
            listener = next((end for end in connection if end in listeners), None)
            if listener is None:
                ranks = {end: rank for end in connection
                         if (rank := self._rank_at(sole_group, end[0], exclude=None)) is not None}
                pairs[connection] = _Pair(sole_group, ranks if len(set(ranks.values())) == len(ranks) else {})
                continue
            group, listener_rank = listeners[listener]
            initiator = connection[0] if connection[1] == listener else connection[1]
            ranks = {listener: listener_rank}
            initiator_rank = self._initiator_rank(group, listener_rank, sequence_numbers.get(connection))
            if initiator_rank is None:
                initiator_rank = self._rank_at(group, initiator[0], exclude=listener_rank)
            if initiator_rank is not None:
                ranks[initiator] = initiator_rank
            pairs[connection] = _Pair(group, ranks)
        return pairs

    def _complete_ranks(self, pairs: dict[tuple[Endpoint, Endpoint], _Pair], local_ip: bytes | None) -> None:
        """Ranks the rendezvous left unknown (the capture lost some or all of it), from what remains: a
        connecting rank's sequence number is its rank when the group's pair identifiers are the ranks
        themselves (torch 2.13: every record lists 0..k-1; assumed when none was seen); the capturing rank
        is on every connection (and published its own address); and a group's last unknown rank is the one
        no connection has."""
        if local_ip is None:
            return
        initiators = {_connection(stream.key): ((stream.key[0], stream.key[1]), stream.sequence_number)
                      for stream in self._gloo.values() if stream.sequence_number is not None}
        for group in {pair.group for pair in pairs.values()}:
            connections = {connection: pair for connection, pair in pairs.items() if pair.group == group}
            records = [record for (record_group, _), record in self._records.items() if record_group == group]
            ranks_are_ids = all(record.pair_ids in ((), tuple(range(len(record.pair_ids)))) for record in records)
            k = self._world_size(group, pairs)
            for connection, pair in connections.items():
                initiator = initiators.get(connection)
                if ranks_are_ids and initiator is not None and initiator[0] not in pair.ranks \
                        and 0 <= initiator[1] < (k or MAX_RANKS):
                    pair.ranks[initiator[0]] = initiator[1]
            local = {rank for pair in connections.values() for end, rank in pair.ranks.items() if end[0] == local_ip}
            if not local and (own := self._rank_at(group, local_ip, exclude=None)) is not None:
                local = {own}
            if len(local) != 1:
                continue
            local_rank = local.pop()
            remote: dict[Endpoint, _Pair] = {}
            for connection, pair in connections.items():
                for end in connection:
                    if end[0] == local_ip:
                        pair.ranks[end] = local_rank
                    else:
                        remote[end] = pair
            unknown = [end for end, pair in remote.items() if end not in pair.ranks]
            missing = set(range(k or 0)) - {local_rank} - {pair.ranks[end] for end, pair in remote.items()
                                                          if end in pair.ranks}
            if len(unknown) == 1 and len(missing) == 1:
                remote[unknown[0]].ranks[unknown[0]] = missing.pop()

    def _ranks_from_traffic(self, pairs: dict[tuple[Endpoint, Endpoint], _Pair], local_ip: bytes | None) -> None:
        """Peers the rendezvous left unknown (up to MAX_GUESSED_PEERS of them), placed by how the capturing
        rank r's collectives treat them: the ring algorithms send to r-1 (all_reduce, reduce) or r+1
        (all_gather) and receive from the other neighbour, the barrier sends to r+d and receives from r-d
        (d = 1, 2, 4, ...), and an all_to_all posts its sends to r+1, r+2, ... in that order. The assignment
        of the missing ranks that contradicts these least, when no other ties with it, is taken."""
        if local_ip is None:
            return
        for group in {pair.group for pair in pairs.values()}:
            connections = {connection: pair for connection, pair in pairs.items() if pair.group == group}
            local = {rank for pair in connections.values() for end, rank in pair.ranks.items() if end[0] == local_ip}
            k = self._world_size(group, pairs)
            if len(local) != 1 or k is None:
                continue
            rank = local.pop()
            remote = {end: pair for connection, pair in connections.items() for end in connection
                      if end[0] != local_ip}
            unknown = [end for end, pair in remote.items() if end not in pair.ranks]
            missing = sorted(set(range(k)) - {rank} - {pair.ranks[end] for end, pair in remote.items()
                                                       if end in pair.ranks})
            if not unknown or len(unknown) != len(missing) or len(unknown) > MAX_GUESSED_PEERS:
                continue
            traffic = self._peer_traffic(remote)
            scores = []
            for guess in itertools.permutations(missing):
                peer = {end: pair.ranks.get(end) for end, pair in remote.items()} | dict(zip(unknown, guess))
                scores.append((gloo_model.peer_contradictions(traffic, peer, rank, k), guess))
            scores.sort()
            if len(scores) == 1 or scores[0][0] < scores[1][0]:
                for end, guessed in zip(unknown, scores[0][1]):
                    remote[end].ranks[end] = guessed

    def _peer_traffic(self, remote: dict[Endpoint, _Pair]) -> dict[tuple[str, int], dict]:
        """Per collective (kind, seq) on the capture: the remote ends it sent to and received from (any
        message stating a transfer), and per end the time of its first NOTIFY_SEND_READY to that end."""
        traffic: dict[tuple[str, int], dict] = {}
        for stream in self._gloo.values():
            source, destination = (stream.key[0], stream.key[1]), (stream.key[2], stream.key[3])
            outgoing = destination in remote
            end = destination if outgoing else source
            if end not in remote:
                continue
            for message in stream.messages:
                key = _collective_key(message.preamble.slot)
                if key is None:
                    continue
                seen = traffic.setdefault(key, {"to": set(), "from": set(), "first_send_ns": {}})
                opcode = message.preamble.opcode
                sends = (opcode != Opcode.NOTIFY_RECV_READY) == outgoing
                seen["to" if sends else "from"].add(end)
                if outgoing and opcode == Opcode.NOTIFY_SEND_READY:
                    seen["first_send_ns"].setdefault(end, message.ts_first_ns)
        return traffic

    def _initiator_rank(self, group: str, listener_rank: int, sequence_number: int | None) -> int | None:
        """The connecting rank: the one whose pair identifier at the listener is the number it sent."""
        if sequence_number is None:
            return None
        pair_ids = self._records[(group, listener_rank)].pair_ids
        if not pair_ids:                          # ranks used as sequence numbers
            return sequence_number
        return pair_ids.index(sequence_number) if pair_ids.count(sequence_number) == 1 else None

    def _rank_at(self, group: str | None, ip: bytes, exclude: int | None) -> int | None:
        """The only rank of `group` published with address `ip` (other than `exclude`), if there is one."""
        candidates = [rank for (record_group, rank), record in self._records.items()
                      if record_group == group and rank != exclude and record.ip == ip]
        return candidates[0] if len(candidates) == 1 else None

    def _local_node(self, pairs: dict) -> tuple[dict[str | None, int], bytes | None]:
        """Per group, the rank on every one of its connections (the capturing node), and the address
        common to every Gloo connection of the capture (the capturing node's, when ranks are unknown)."""
        group_ranks: dict[str | None, set[int]] = {}
        for pair in pairs.values():
            if len(pair.ranks) == 2:
                ranks = set(pair.ranks.values())
                group_ranks[pair.group] = group_ranks.get(pair.group, ranks) & ranks
        local_rank = {group: ranks.pop() for group, ranks in group_ranks.items() if len(ranks) == 1}
        addresses = None
        for connection in pairs:
            ends = {connection[0][0], connection[1][0]}
            addresses = ends if addresses is None else addresses & ends
        if addresses and len(addresses) > 1 and len(addresses & self._host_addresses) == 1:
            addresses &= self._host_addresses
        local_ip = next(iter(addresses)) if addresses and len(addresses) == 1 else None
        if local_ip is not None:
            for pair in pairs.values():
                local = {rank for end, rank in pair.ranks.items() if end[0] == local_ip}
                if pair.group not in local_rank and len(local) == 1:
                    local_rank[pair.group] = local.pop()
        return local_rank, local_ip

    def _world_size(self, group: str | None, pairs: dict) -> int | None:
        records = [record for (record_group, _), record in self._records.items() if record_group == group]
        if group is not None and records:
            pair_counts = {len(record.pair_ids) for record in records if record.pair_ids}
            if len(pair_counts) == 1:
                return pair_counts.pop()
            return max(rank for (record_group, rank) in self._records if record_group == group) + 1
        # Without the rendezvous: Gloo connects every pair of a group, so the capturing node has k-1 peers.
        return sum(1 for pair in pairs.values() if pair.group == group) + 1

    # -- TCPStore ---------------------------------------------------------------------------------
    def _take_exchanges(self, connection: _StoreConnection) -> None:
        stream_id = connection.client_stream_id
        while (exchange := connection.decoder.next_event()) is not NEED_DATA:
            request, response = exchange.request, exchange.response
            rendezvous = {}
            for key, value in _key_values(exchange):
                rendezvous.update(tcpstore.torchelastic_fields(key, value))
                group_rank = split_rank_key(key)
                if group_rank is None:
                    continue
                try:
                    self._records[group_rank] = parse_rank_record(value)
                except DecodeError:
                    continue
            value_bytes = sum(map(len, request.values)) + (sum(map(len, response.values)) if response else 0)
            self._store_rows.append({
                "protocol": "tcpstore", "stream_id": stream_id, "ts_first_ns": request.ts_first_ns,
                "ts_last_ns": response.ts_last_ns if response else request.ts_last_ns,
                "stream_offset_bytes": request.offset,
                "size_bytes": request.size_bytes, "complete": response is not None or
                request.query in tcpstore.NO_RESPONSE_QUERIES,
                "store_query": request.query.name, "store_key": request.keys[0] if request.keys else None,
                "store_keys": len(request.keys), "value_bytes": value_bytes,
                "response_bytes": response.size_bytes if response else None,
                "store_number": response.number if response and response.number is not None else request.number,
                **rendezvous,
            })


MAX_GUESSED_PEERS = 4           # unknown peers placed by the structure of the collectives (permutations tried)


def _collective_key(slot: int) -> tuple[str, int] | None:
    parsed = parse_slot(slot)
    return None if parsed.kind == P2P else (parsed.kind, parsed.tag)


def _sequence_space_rows(stream_id: int, stream: _GlooStream, context: dict) -> list[dict]:
    """The direction's sequence space for the job step's sizes (decoders.protocols.gloo.job)."""
    start = CONNECT_SEQUENCE.size if stream.sequence_number is not None else 0
    return gloo_job.sequence_space_rows(
        stream_id, context, start, stream.decoder.offset,
        [(_collective_key(message.preamble.slot), message.offset, message.preamble.nbytes)
         for message in stream.messages])


def _connection(key: StreamKey) -> tuple[Endpoint, Endpoint]:
    """Both directions of a TCP connection share this key."""
    ends = ((key[0], key[1]), (key[2], key[3]))
    return (ends[0], ends[1]) if ends[0] <= ends[1] else (ends[1], ends[0])


def _address(endpoint: Endpoint) -> str:
    return f"{ip_to_str(endpoint[0])}:{endpoint[1]}"


def _key_values(exchange: tcpstore.StoreExchange) -> list[tuple[str, bytes]]:
    """The (key, value) pairs an exchange shows: values set by the request or returned by the response."""
    request, response = exchange.request, exchange.response
    query = request.query
    if query in (tcpstore.Query.SET, tcpstore.Query.MULTI_SET):
        return list(zip(request.keys, request.values))
    if query == tcpstore.Query.COMPARE_SET and response is not None:
        return [(request.keys[0], response.values[0])]
    if query in (tcpstore.Query.GET, tcpstore.Query.MULTI_GET) and response is not None:
        return list(zip(request.keys, response.values))
    return []


def _message_row(stream_id: int, message: GlooMessage, context: dict) -> dict:
    preamble = message.preamble
    slot = parse_slot(preamble.slot)
    kind = slot.kind
    if kind == P2P and preamble.opcode == Opcode.SEND_BUFFER:
        kind = None           # gloo's older, buffer-based algorithms: slots numbered per context, no kind
    return {
        "protocol": "gloo", "stream_id": stream_id, "ts_first_ns": message.ts_first_ns,
        "ts_last_ns": message.ts_last_ns, "size_bytes": preamble.nbytes, "complete": message.complete,
        "opcode": preamble.opcode.name, "slot": preamble.slot, "collective": kind,
        "seq": slot.tag if kind not in (P2P, None) else None, "tag": slot.tag, "slot_delta": slot.delta,
        "offset_bytes": preamble.offset, "length_bytes": preamble.length, "roffset_bytes": preamble.roffset,
        "payload_bytes": preamble.payload_bytes, "missing_bytes": message.missing_bytes,
        "stream_offset_bytes": message.offset, **context,
    }
