"""The tables `dlcsniff stats` writes, each in one place: its Arrow schema and what every column holds (named
as decoders/schema.py says: times in ns with `ts`, durations and sizes with their unit as suffix).

A ps-lite job gets the SketchDLC tables (iterations … volume_keys) and the merged view's (requests …
key_updates); a collective job the collective_* tables and the merged view's connections.
"""
from __future__ import annotations

from dlcsniff.decoders.schema import BOOL, F64, I32, I64, STR, U64, Table, table

VANTAGE = ("vantage", STR, "own: from the node's own capture; peers: from its peers' captures")

ITERATIONS = table("iterations", "stats", "worker iteration (SketchDLC's phases, from the worker's "
                   "own records)", [
    ("worker_rank", I32, "the worker"),
    ("iteration", I32, "the iteration, from 0 after initialisation"),
    ("start_ts_ns", I64, "when it started: the previous iteration's last pull received (else its first push; "
                         "null: neither seen)"),
    ("phase1_s", F64, "P1: last pull received of the previous iteration → first push sent"),
    ("phase2_s", F64, "P2: first → last push sent (gradients leave while backward runs)"),
    ("phase3_s", F64, "P3: first push sent → last pull received"),
    ("computation_s", F64, "P1 + P2"),
    ("communication_s", F64, "P3"),
    ("iteration_s", F64, "P1 + P3"),
    ("overlap_ratio", F64, "P2 / (P1 + P3)"),
    ("wait_s", F64, "first → last pull received"),
    VANTAGE,
])

KEYS = table("keys", "stats", "(server, tensor, training iteration): SketchDLC's server overheads", [
    ("server_rank", I32, "the server"),
    ("tensor_key", I64, "the tensor"),
    ("iteration", I32, "the iteration"),
    ("size_bytes", I64, "the round's largest push (meta + data)"),
    ("sync_overhead_us", F64, "sync mode: first → last push received in the round"),
    ("update_overhead_us", F64, "last push received → the server's first answer (async: per push, the mean)"),
    ("search_overhead_us", F64, "pull received → pull answered, the mean over explicit pulls"),
    ("pushes", I64, "pushes received in the round"),
    ("pulls", I64, "explicit pulls answered in the round"),
    VANTAGE,
    ("push_times_known", BOOL, "the server's capture saw every push of the round whole (sync mode: one from each "
                               "worker); false: sync_overhead_us and update_overhead_us are null, the pushes' "
                               "arrival being unknown (analysis/overheads.py)"),
])

SIZES = table("sizes", "stats", "DLC operation: its message sizes (meta + data)", [
    ("operation", STR, "the operation (Push_Send_Worker, ..., or a command / control category)"),
    ("class", STR, "long (carries tensors), short (constant size) or other (commands, control)"),
    ("messages", I64, "records"),
    ("bytes", I64, "their bytes in all"),
    ("min_bytes", I64, "smallest"),
    ("mean_bytes", F64, "mean"),
    ("max_bytes", I64, "largest"),
    ("p25_bytes", F64, "25th percentile"),
    ("p50_bytes", F64, "median"),
    ("p75_bytes", F64, "75th percentile"),
    ("p99_bytes", F64, "99th percentile"),
])

TRAFFIC = table("traffic", "stats", "(sender, receiver) node pair: the traffic matrix, each message "
                "once", [
    ("src_rank", I32, "sender's DLC rank (workers, then servers, then the scheduler)"),
    ("dst_rank", I32, "receiver's DLC rank"),
    ("src", STR, "sender's name (worker0, server1, scheduler)"),
    ("dst", STR, "receiver's name"),
    ("messages", I64, "messages"),
    ("bytes", I64, "their bytes (meta + data)"),
])

VOLUME_ITERATIONS = table("volume_iterations", "stats", "worker iteration: the bytes it moved", [
    ("worker_rank", I32, "the worker"),
    ("iteration", I32, "the iteration (-1: initialisation)"),
    ("phase", STR, "init or train"),
    ("messages", I64, "data messages sent and received"),
    ("push_bytes", I64, "bytes pushed"),
    ("pull_bytes", I64, "bytes of values received"),
    ("total_bytes", I64, "bytes sent and received"),
])

VOLUME_KEYS = table("volume_keys", "stats", "tensor: its volume over the training iterations, from "
                    "the workers' records", [
    ("tensor_key", I64, "the tensor"),
    ("req_type", STR, "its request type (default, row_sparse, ...; unknown: never pushed)"),
    ("servers", I64, "servers holding parts of it"),
    ("pushes", I64, "pushes"),
    ("pulls", I64, "pull responses"),
    ("push_bytes", I64, "bytes pushed"),
    ("pull_bytes", I64, "bytes pulled"),
    ("iterations", I64, "iterations it moved in"),
    ("workers", I64, "workers that moved it"),
    ("rows_per_push", F64, "row-sparse: mean rows per push"),
    ("push_bytes_per_iteration", F64, "push_bytes per iteration per worker", "bytes"),
    ("pull_bytes_per_iteration", F64, "pull_bytes per iteration per worker", "bytes"),
])

REQUESTS = table("requests", "stats", "ps-lite request/response pair: where its time went, on the "
                 "job's one timeline (analysis/latency.py; W the worker's capture, S the server's)", [
    ("worker_id", I32, "the requesting node"),
    ("server_id", I32, "the answering node"),
    ("kind", STR, "push, pull, pushpull (MXNet's fused push-pull, the identifier of what every output prints as "
                  "push-pull) or command"),
    ("tensor_key", I64, "the tensor"),
    ("customer_id", I32, "ps-lite customer id"),
    ("ps_timestamp", I32, "ps-lite timestamp (the request counter that pairs them)"),
    ("req_type", STR, "MXNet request type"),
    ("request_bytes", I64, "the request's bytes"),
    ("response_bytes", I64, "the response's bytes"),
    ("connection", STR, "the request's connection, src_ip:port>dst_ip:port"),
    ("view", STR, "both (W and S captured), worker (W only) or server (S only)"),
    ("ts_first_ns", I64, "first request byte, at W when W saw it, else at S"),
    ("total_ns", I64, "first request byte → last response byte (at W; S's view when only S saw it)"),
    ("request_wire_ns", I64, "first → last request byte at W"),
    ("request_transit_ns", I64, "last request byte at W → at S"),
    ("server_ns", I64, "last request byte at S → first response byte at S"),
    ("response_wire_ns", I64, "first → last response byte at S"),
    ("response_transit_ns", I64, "last response byte at S → at W"),
    ("unsplit_ns", I64, "what one vantage point cannot split (null when both ends were captured)"),
    ("clock_fix_us", F64, "how far S's times were moved to keep the transits non-negative (within the clocks' "
                          "bound)"),
])

IN_FLIGHT = table("in_flight", "stats", "change of the requests in flight on a connection", [
    ("connection", STR, "the request connection"),
    ("worker_id", I32, "the requesting node"),
    ("server_id", I32, "the answering node"),
    ("ts_ns", I64, "when it changed (reference clock)"),
    ("in_flight", I64, "requests in flight from then on"),
])

CONNECTIONS = table("connections", "stats", "TCP connection attempt whose SYN a capture saw: "
                    "set-up costs", [
    ("connection", STR, "src_ip:port>dst_ip:port"),
    ("src_ip", STR, "connecting address"),
    ("src_port", I32, "connecting port"),
    ("dst_ip", STR, "accepting address"),
    ("dst_port", I32, "accepting port"),
    ("capture", STR, "the capture it was measured in"),
    ("at_connector", BOOL, "measured at the connector's capture (false: at the acceptor's)"),
    ("syn_ts_ns", I64, "the SYN (reference clock)"),
    ("handshake_rtt_ns", I64, "SYN → SYN-ACK (or the RST refusing it); at the acceptor: its turnaround only"),
    ("setup_ns", I64, "SYN → first byte of the first ZMTP message either way"),
    ("attempt", I32, "0, 1, ... per (source address, destination address and port), in SYN order"),
    ("refused", BOOL, "the acceptor answered with a reset and no byte flowed"),
    ("since_previous_ns", I64, "the previous attempt's last packet → this SYN (negative: it was still open)"),
])

KEY_UPDATES = table("key_updates", "stats", "ps-lite key pushed with values: how often each is "
                    "updated", [
    ("tensor_key", I64, "the tensor the key belongs to"),
    ("ps_key", U64, "the ps-lite key (a row-sparse tensor's rows are keys of their own)"),
    ("req_type", STR, "MXNet request type of the pushes"),
    ("updates", I64, "pushes that carried values for it"),
])

COLLECTIVE_STATS = table("collective_stats", "stats", "collective operation across its ranks "
                         "(analysis/collective_stats.py)", [
    ("op", STR, "its name: kind#seq, or send_recv src→dst#seq"),
    ("protocol", STR, "gloo, nccl_socket or roce"),
    ("pg", STR, "the process group"),
    ("kind", STR, "the collective (send and recv of one message: send_recv)"),
    ("seq", I64, "sequence number in its group"),
    ("src_rank", I32, "send_recv: the sender (-1: not a send_recv, or unknown)"),
    ("dst_rank", I32, "send_recv: the receiver (-1: not a send_recv, or unknown)"),
    ("world_size", I32, "ranks in the group"),
    ("ranks_seen", I64, "captures (ranks) that saw it"),
    ("algorithm", STR, "ring, tree, ..."),
    ("size_bytes", I64, "S, the size nccl-tests would report (median of the ranks' tensor_bytes)"),
    ("ts_first_ns", I64, "the first rank's start"),
    ("ts_last_ns", I64, "the last rank's end"),
    ("time_ns", I64, "the first start → the last end"),
    ("rank_time_mean_ns", F64, "the mean of the ranks' own times"),
    ("bus_factor", F64, "busbw / algbw for its kind and group size (nccl-tests)"),
    ("algbw_gb_per_s", F64, "S / time_ns"),
    ("busbw_gb_per_s", F64, "algbw × bus_factor"),
    ("start_skew_ns", I64, "last start − first start over the ranks (null with one rank)"),
    ("end_skew_ns", I64, "last end − first end over the ranks (null with one rank)"),
    ("wire_bytes", I64, "bytes the ranks sent for it, framing included"),
    ("complete", BOOL, "every rank's view of it was complete"),
])

COLLECTIVE_RANKS = table("collective_ranks", "stats", "collective operation per rank", [
    ("op", STR, "the operation (collective_stats.op)"),
    ("protocol", STR, "gloo, nccl_socket or roce"),
    ("pg", STR, "the process group"),
    ("kind", STR, "the collective"),
    ("seq", I64, "sequence number in its group"),
    ("capture", STR, "the rank's capture"),
    ("rank", I32, "the rank (-1: unknown)"),
    ("algorithm", STR, "ring, tree, ..."),
    ("size_bytes", I64, "S of the operation"),
    ("ts_first_ns", I64, "its first byte on this rank's wire"),
    ("ts_last_ns", I64, "its last byte on this rank's wire"),
    ("time_ns", I64, "this rank's time"),
    ("algbw_gb_per_s", F64, "S / this rank's time"),
    ("busbw_gb_per_s", F64, "algbw × the operation's bus_factor"),
    ("start_lag_ns", I64, "after the first rank's start"),
    ("end_lag_ns", I64, "after the first rank's end"),
    ("wire_bytes_sent", I64, "bytes this rank sent for it", "bytes"),
    ("wire_bytes_received", I64, "bytes this rank received for it", "bytes"),
    ("messages", I64, "messages at this rank"),
    ("complete", BOOL, "this rank's view was complete"),
])

COLLECTIVE_TRAFFIC = table("collective_traffic", "stats", "(operation, source rank, destination "
                           "rank): the volume matrices, each message once", [
    ("protocol", STR, "gloo, nccl_socket or roce"),
    ("pg", STR, "the process group"),
    ("kind", STR, "the collective"),
    ("seq", I64, "sequence number in its group"),
    ("src_rank", I32, "sending rank"),
    ("dst_rank", I32, "receiving rank"),
    ("payload_bytes", I64, "payload bytes, from the fuller of the two ends' views"),
    ("wire_bytes", I64, "bytes with framing, from the same view"),
    ("messages", I64, "messages"),
    ("seen_at", STR, "both, sender or receiver: whose captures saw it"),
])

COLLECTIVE_CONCURRENCY = table("collective_concurrency", "stats", "stretch of a rank's time with a "
                               "constant number of collectives in flight", [
    ("capture", STR, "the rank's capture"),
    ("rank", I32, "the rank"),
    ("ts_first_ns", I64, "the stretch's start"),
    ("ts_last_ns", I64, "the stretch's end"),
    ("in_flight", I64, "collectives in flight (0: a gap, computation or idle)"),
])

COLLECTIVE_OVERLAP = table("collective_overlap", "stats", "rank: how much of its time collectives "
                           "take", [
    ("capture", STR, "the rank's capture"),
    ("rank", I32, "the rank"),
    ("ts_first_ns", I64, "its first collective's start"),
    ("ts_last_ns", I64, "its last collective's end"),
    ("wall_ns", I64, "ts_last_ns − ts_first_ns"),
    ("communication_ns", I64, "time with at least one collective in flight"),
    ("gap_ns", I64, "time with none (computation or idle)"),
    ("gaps", I64, "stretches with none"),
    ("longest_gap_ns", I64, "the longest of them"),
    ("concurrent_ns", I64, "time with two or more in flight"),
    ("collective_ns", I64, "the collectives' own times, summed"),
    ("communication_fraction", F64, "communication_ns / wall_ns"),
    ("concurrent_fraction", F64, "concurrent_ns / communication_ns"),
])

# an operation whose ranks arrive: a collective, or a ps-lite sync round
ARRIVAL_OPERATION = [
    ("protocol", STR, "gloo, nccl_socket, roce or pslite"),
    ("pg", STR, "the process group (empty for ps-lite)"),
    ("kind", STR, "the collective; push: a ps-lite sync round (a training iteration's pushes)"),
    ("seq", I64, "sequence number in its group; ps-lite: the training iteration"),
]

ARRIVALS = table("arrivals", "stats", "(collective or sync round, rank): when the rank entered it "
                 "(analysis/arrivals.py)", [
    *ARRIVAL_OPERATION,
    ("role", STR, "rank (a collective's) or worker (a ps-lite round's)"),
    ("rank", I32, "the rank (ps-lite: the worker's rank)"),
    ("world_size", I32, "ranks in the group (ps-lite: workers)"),
    ("capture", STR, "the capture its entry was seen in"),
    ("evidence", STR, "sent: its first message, at the sender; received: at the receiver (the sender's "
                      "capture missing); first_byte: its first byte on its wire, sent or received (NCCL)"),
    ("entry_ts_ns", I64, "its entry (its first message sent), on the job's one timeline"),
    ("exit_ts_ns", I64, "its exit (the last byte of its messages for it)"),
    ("lag_ns", I64, "its entry minus the median of the other ranks' (null: the only rank seen)"),
    ("idle_ns", I64, "its entry minus its exit from its previous operation of the group (null: not seen)"),
    ("idle_lag_ns", I64, "its idle_ns minus the median of the other ranks' (a stall of its own, not its "
                         "previous operation's length)"),
])

ARRIVAL_SPREAD = table("arrival_spread", "stats", "collective or sync round: how far apart its ranks arrived "
                       "and how long it took once all were in", [
    *ARRIVAL_OPERATION,
    ("role", STR, "rank or worker"),
    ("world_size", I32, "ranks in the group"),
    ("ranks", I64, "ranks whose entry was seen"),
    ("first_entry_ts_ns", I64, "the first rank's entry"),
    ("last_entry_ts_ns", I64, "the last rank's entry"),
    ("arrival_spread_ns", I64, "last_entry_ts_ns − first_entry_ts_ns"),
    ("latest_rank", I32, "the rank that came last"),
    ("last_exit_ts_ns", I64, "the last rank's exit: the operation's end"),
    ("completion_ns", I64, "last_exit_ts_ns − last_entry_ts_ns: its time once every rank was in"),
    ("span_ns", I64, "last_exit_ts_ns − first_entry_ts_ns"),
])

HOST = [("node", STR, "the host's name (rank 2, worker rank 0) or its address"), ("ip", STR, "its address"),
        ("direction", STR, "send or recv")]

LINK_HEALTH = table("link_health", "stats", "(host, direction): what limited its link "
                    "(analysis/link_health.py)", [
    *HOST,
    ("bytes", I64, "payload bytes of its streams that way, each stream once"),
    ("rated_bytes", I64, "bytes of its large messages (64 KiB and more), the ones its rate is measured on"),
    ("busy_ns", I64, "the union of their transfer times (first to last byte)"),
    ("rate_gb_per_s", F64, "rated_bytes / busy_ns"),
    ("peers_rate_gb_per_s", F64, "the median of the other hosts' rates the same way"),
    ("retransmitted_bytes", I64, "payload bytes seen again (retransmissions)"),
    ("retransmitted_fraction", F64, "retransmitted_bytes / bytes"),
    ("zero_windows", I64, "TCP: zero receive windows that held it (recv: the host's own advertisements; send: its "
                          "peers')"),
    ("zero_window_s", F64, "TCP: the time its streams' receivers kept their windows at zero (the most any capture "
                           "saw)"),
    ("naks", I64, "RoCE: negative acknowledgements on its streams"),
    ("cnps", I64, "RoCE: congestion notification packets"),
    ("roce_retransmitted_packets", I64, "RoCE: packets whose PSN was seen before"),
    ("slow_links", STR, "its slow links that way, source→destination: below a sixth of the job's upper quartile "
                        "of link rates, both overall and at their best (analysis/link_health.py)"),
    ("explained_by", STR, "the host(s) a smallest cover of the slow links blames for them"),
    ("limited_by", STR, "rate, retransmissions, zero_windows (10 ms and more at zero window), naks, cnps, "
                        "roce_retransmissions (comma-separated; empty: nothing)"),
])

BURSTINESS = table("burstiness", "stats", "(host, direction, bin width): its peak rate against its mean "
                   "(analysis/traffic_shape.py)", [
    *HOST,
    ("bin_ns", I64, "the bin width: 1, 5 or 10 ms"),
    ("bins", I64, "bins over its span"),
    ("bytes", I64, "bytes of its messages that way (each message's bytes spread over its first to last byte)"),
    ("span_ns", I64, "its first to its last byte that way"),
    ("mean_rate_gb_per_s", F64, "bytes / span"),
    ("peak_rate_gb_per_s", F64, "the busiest bin's bytes / the bin width"),
    ("peak_to_mean", F64, "peak_rate_gb_per_s / mean_rate_gb_per_s"),
])

ON_OFF = table("on_off", "stats", "(host, direction): its ON and OFF periods (1 ms bins with and without "
               "traffic) against the iteration period", [
    *HOST,
    ("bin_ns", I64, "the bin width"),
    ("on_fraction", F64, "bins with traffic / bins over its span"),
    ("on_periods", I64, "runs of bins with traffic"),
    ("on_median_ns", I64, "their median length"),
    ("off_median_ns", I64, "the median length of the runs without (null: none)"),
    ("longest_off_ns", I64, "the longest run without"),
    ("iteration_period_ns", I64, "the job's iteration period: the median time between a rank's entries into "
                                 "consecutive operations of its most frequent kind"),
    ("cycles_per_iteration", F64, "iteration period / (median ON + median OFF): 1 when the traffic turns on and "
                                  "off once per iteration"),
])

INCAST = table("incast", "stats", "receiving host: how many senders' messages arrive together "
               "(analysis/incast.py)", [
    HOST[0], HOST[1],
    ("senders", I64, "hosts that sent it messages"),
    ("max_fan_in", I64, "the most senders arriving at once (within window_ns of each other)"),
    ("busy_ns", I64, "time with at least one sender arriving"),
    ("incast_ns", I64, "time with two or more"),
    ("incast_fraction", F64, "incast_ns / busy_ns"),
    ("mean_fan_in", F64, "senders arriving, averaged over busy_ns"),
    ("incast_episodes", I64, "stretches of two or more"),
    ("window_ns", I64, "how long after its last byte a sender still counts as arriving"),
])

SIZE_DISTRIBUTIONS = table("size_distributions", "stats", "(kind, protocol): the distribution of message or "
                           "flow sizes (analysis/size_distributions.py)", [
    ("kind", STR, "message (each message of the job once) or flow (each TCP direction or RoCE stream once)"),
    ("protocol", STR, "its protocol (tcp: a flow no decoder claimed)"),
    ("count", I64, "messages or flows"),
    ("bytes", I64, "their bytes in all"),
    ("min_bytes", I64, "smallest"),
    ("mean_bytes", F64, "mean"),
    ("p50_bytes", F64, "median"),
    ("p90_bytes", F64, "90th percentile"),
    ("p99_bytes", F64, "99th percentile"),
    ("max_bytes", I64, "largest"),
])

ROCE_PATHS = table("roce_paths", "stats", "(source, destination) host pair with RoCEv2 streams: the UDP "
                   "source ports ECMP hashes on (analysis/roce_paths.py)", [
    ("src_ip", STR, "source address"),
    ("dst_ip", STR, "destination address"),
    ("queue_pairs", I64, "its queue pairs (destination QPs)"),
    ("packets", I64, "their packets, each stream once"),
    ("src_ports", I64, "distinct UDP source ports of their packets"),
    ("port_entropy_ratio", F64, "the Shannon entropy of the packets' source ports / log2(queue_pairs), its most: "
                                "1 when each queue pair has its own port and all are equally busy, 0 when every "
                                "packet hashes alike (null: one queue pair)"),
])

ROCE_COLLECTIVES = table("roce_collectives", "stats", "collective operation met by a RoCE congestion or loss "
                         "signal: CNPs, NAKs and retransmitted packets while it was in flight", [
    ("protocol", STR, "roce, nccl_socket, gloo"),
    ("kind", STR, "the collective"),
    ("seq", I64, "its sequence number"),
    ("cnps", I64, "congestion notification packets"),
    ("naks", I64, "negative acknowledgements"),
    ("retransmitted_packets", I64, "packets whose PSN was seen before"),
])

STATS_TABLES: dict[str, Table] = {t.name: t for t in (
    ITERATIONS, KEYS, SIZES, TRAFFIC, VOLUME_ITERATIONS, VOLUME_KEYS, REQUESTS, IN_FLIGHT, CONNECTIONS, KEY_UPDATES,
    COLLECTIVE_STATS, COLLECTIVE_RANKS, COLLECTIVE_TRAFFIC, COLLECTIVE_CONCURRENCY, COLLECTIVE_OVERLAP,
    ARRIVALS, ARRIVAL_SPREAD, LINK_HEALTH, BURSTINESS, ON_OFF, INCAST, SIZE_DISTRIBUTIONS, ROCE_PATHS,
    ROCE_COLLECTIVES)}
