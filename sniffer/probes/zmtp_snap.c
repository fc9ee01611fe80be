// The snap filter: a socket filter on the daemon's packet socket that cuts each packet right after the
// last byte the decoders need (TCP/IP headers, ZMTP greetings, every ZMTP frame header, the bodies of
// command frames, of each message's first SNAP_KEPT_FIRST_FRAMES data frames (ps-lite's routing id, meta and
// keys: kept whatever their size) and of the other data frames up to SNAP_KEPT_BODY_MAX: the rule the decoders
// keep bodies by (decoders/protocols/__init__.py ZMTP_KEPT_BODIES), so a cut never takes a byte they read). Its return value is the number of bytes
// the packet socket keeps: 0 drops the packet, the packet's length keeps it whole. The wire length in the
// pcap record stays the packet's length.
//
// Compiled with the probes (one bcc compile, sniffer/ebpf.py) with these -D flags:
//   SNAP_LINK_HEADER_LEN    bytes before the network header in what the socket sees (cooked: 0, Ethernet: 14)
//   SNAP_KEPT_FIRST_FRAMES  a message's first data frames whose bodies are always kept (ZMTP_KEPT_BODIES)
//   SNAP_KEPT_BODY_MAX      later data frames keep their body up to this size (ZMTP_KEPT_BODIES)
//   SNAP_PORT_WANTED(port)    (with --ports) true for the TCP ports to capture: other packets are dropped
//   SNAP_MAX_FRAMES           frames parsed per packet; past it the flow is kept whole from then on
//
// Per TCP direction the filter follows the ZMTP 3.x framing by sequence number, from the SYN on. Whatever
// it cannot follow (no SYN seen, not a ZMTP 3.x greeting, a gap where a frame header may be that does not
// fill, a frame loop past its bound, flags ZMTP does not define) keeps whole packets for that direction for
// good: the decoders resynchronise on them. Packets at or before the followed position (retransmissions,
// late packets) are kept whole.
#include <uapi/linux/if_ether.h>
#include <uapi/linux/if_packet.h>

#define SNAP_WHOLE 0xFFFFFFFFu
#define SNAP_LOOPBACK_IFINDEX 1            // every namespace's lo (net/core/dev.c LOOPBACK_IFINDEX)
#define ZMTP_GREETING_LEN 64
#define SNAP_WAIT_LIMIT (1u << 20)    // bytes kept whole while waiting for a hole to fill
#define SNAP_LOCK_TRIES 4096               // attempts to take a flow another CPU holds
#define ZMTP_FLAG_MORE 0x01
#define ZMTP_FLAG_LONG 0x02                // ZMTP 3.x: LONG => 8-byte big-endian size, else 1 byte
#define ZMTP_FLAG_COMMAND 0x04
#define ZMTP_FLAGS_DEFINED (ZMTP_FLAG_MORE | ZMTP_FLAG_LONG | ZMTP_FLAG_COMMAND)
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04

enum snap_counter { SNAP_PACKETS_CUT, SNAP_BYTES_CUT, SNAP_FULL_FLOWS, SNAP_COUNTER_COUNT };
enum snap_phase { SNAP_GREETING, SNAP_HEADER, SNAP_BODY_KEEP, SNAP_BODY_SKIP, SNAP_FULL };

struct snap_flow_key {
    u8 src_addr[16];                       // IPv4: the first 4 bytes
    u8 dst_addr[16];
    u16 src_port;
    u16 dst_port;
    u32 family;                            // 4 or 6
};

struct snap_flow {
    u64 remaining_bytes;                   // SNAP_BODY_*: body bytes still to come
    u32 next_seq;                          // TCP sequence number of the next stream byte
    u32 stream_offset;                     // SNAP_GREETING: greeting bytes seen
    u64 busy;                              // 1 while a CPU follows the flow (packets of one flow can be
                                           // handled on two CPUs at once: the state has one writer at a time)
    u32 hole_end;                          // waiting: where the packets kept whole after a hole begin...
    u32 ahead_end;                         // ...and end
    u8 phase;
    u8 waiting;                            // a hole that may hold a frame header is still open
    u8 conflict;                           // a packet went by while another CPU held the flow
    u8 frame_index;                        // data frames of the current message before this one (max 255)
    u8 header_bytes;                       // SNAP_HEADER: bytes of a frame header that straddles packets
    u8 header[9];                          // flags, size (1 or 8 bytes)
};

BPF_TABLE("lru_hash", struct snap_flow_key, struct snap_flow, snap_flows, 65536);
BPF_PERCPU_ARRAY(snap_counts, u64, SNAP_COUNTER_COUNT);

static __always_inline void snap_count(u32 counter, u64 amount) {
    u64 *slot = snap_counts.lookup(&counter);
    if (slot)
        *slot += amount;
}

static __always_inline u32 snap_mark_full(struct snap_flow *flow) {
    flow->phase = SNAP_FULL;
    snap_count(SNAP_FULL_FLOWS, 1);
    return SNAP_WHOLE;
}

// The greeting's bytes in [cursor, end) (it may come in several segments: libzmq sends the signature,
// then the version, then the rest). Returns SNAP_WHOLE when the stream is not ZMTP 3.x.
static __always_inline u32 snap_greeting(struct __sk_buff *skb, struct snap_flow *flow, u32 *cursor, u32 end) {
    u32 offset = flow->stream_offset;
    u32 count = ZMTP_GREETING_LEN - offset;
    if (count > end - *cursor)
        count = end - *cursor;
    u8 byte = 0;
    // signature: 0xFF, 8 padding bytes, 0x7F; then the major version
    if (offset == 0 && (bpf_skb_load_bytes(skb, *cursor, &byte, 1) || byte != 0xFF))
        return snap_mark_full(flow);
    if (offset <= 9 && 9 < offset + count && (bpf_skb_load_bytes(skb, *cursor + 9 - offset, &byte, 1) || byte != 0x7F))
        return snap_mark_full(flow);
    if (offset <= 10 && 10 < offset + count && (bpf_skb_load_bytes(skb, *cursor + 10 - offset, &byte, 1) || byte != 3))
        return snap_mark_full(flow);
    flow->stream_offset = offset + count;
    *cursor += count;
    if (flow->stream_offset == ZMTP_GREETING_LEN)
        flow->phase = SNAP_HEADER;
    return 0;
}

// One frame header from [cursor, end), possibly completing bytes an earlier packet held. Returns 1 when
// the header is complete (phase set for its body), 0 when the packet ended inside it, SNAP_WHOLE when the
// flags are not ZMTP's.
static __always_inline u32 snap_header(struct __sk_buff *skb, struct snap_flow *flow, u32 *cursor, u32 end) {
    u8 *header = flow->header;
    u32 have = flow->header_bytes;
    if (have == 0) {
        if (bpf_skb_load_bytes(skb, *cursor, header, 1))
            return snap_mark_full(flow);
        if (header[0] & ~ZMTP_FLAGS_DEFINED)
            return snap_mark_full(flow);
        have = 1;
        *cursor += 1;
    }
    u32 need = header[0] & ZMTP_FLAG_LONG ? 9 : 2;
    u32 avail = end - *cursor;
    if (have == 1 && avail >= need - 1) {
        // the common case: the size bytes are all here
        if (need == 9 ? bpf_skb_load_bytes(skb, *cursor, header + 1, 8) : bpf_skb_load_bytes(skb, *cursor, header + 1, 1))
            return snap_mark_full(flow);
        *cursor += need - 1;
        have = need;
    } else {
        for (u32 i = 0; i < 8 && have < need && *cursor < end; i++) {
            // have is 1..8 here; the mask shows the verifier the byte stays inside header[1..8]
            if (bpf_skb_load_bytes(skb, *cursor, header + 1 + ((have - 1) & 7), 1))
                return snap_mark_full(flow);
            have += 1;
            *cursor += 1;
        }
    }
    if (have < need) {
        flow->header_bytes = have;
        return 0;
    }
    flow->header_bytes = 0;
    u64 size = header[1];
    if (need == 9) {
        u64 big_endian = 0;
        __builtin_memcpy(&big_endian, header + 1, 8);
        size = __builtin_bswap64(big_endian);
    }
    if (size >> 62)
        return snap_mark_full(flow);
    flow->remaining_bytes = size;
    u8 flags = header[0];
    flow->phase = flags & ZMTP_FLAG_COMMAND || flow->frame_index < SNAP_KEPT_FIRST_FRAMES || size <= SNAP_KEPT_BODY_MAX
                  ? SNAP_BODY_KEEP : SNAP_BODY_SKIP;
    if (!(flags & ZMTP_FLAG_COMMAND))
        flow->frame_index = !(flags & ZMTP_FLAG_MORE) ? 0 : flow->frame_index < 255 ? flow->frame_index + 1 : 255;
    return 1;
}

// The TCP payload [cursor, end) at the flow's next sequence number: returns how many bytes of the packet
// to keep (at least `keep`, the headers), or SNAP_WHOLE.
static __always_inline u32 snap_payload(struct __sk_buff *skb, struct snap_flow *flow, u32 cursor, u32 end, u32 keep) {
    if (flow->phase == SNAP_GREETING) {
        if (snap_greeting(skb, flow, &cursor, end))
            return SNAP_WHOLE;
        keep = cursor;
    }
    for (u32 frame = 0; frame < SNAP_MAX_FRAMES; frame++) {
        if (cursor >= end || flow->phase == SNAP_FULL)
            return flow->phase == SNAP_FULL ? SNAP_WHOLE : keep;
        if (flow->phase == SNAP_HEADER) {
            u32 done = snap_header(skb, flow, &cursor, end);
            keep = cursor;
            if (done != 1)
                return done == 0 ? keep : SNAP_WHOLE;
        }
        u64 count = flow->remaining_bytes < end - cursor ? flow->remaining_bytes : end - cursor;
        cursor += count;
        flow->remaining_bytes -= count;
        if (flow->phase == SNAP_BODY_KEEP)
            keep = cursor;
        if (flow->remaining_bytes == 0)
            flow->phase = SNAP_HEADER;
    }
    if (cursor >= end)
        return keep;
    return snap_mark_full(flow);
}

// A flow waiting for the bytes of a hole [next_seq, hole_end) that may hold a frame header, the packets
// seen after it (within [hole_end, ahead_end)) kept whole meanwhile, as are more of them (up to
// SNAP_WAIT_LIMIT). The late packets filling the hole from its start are followed (the framing is
// known there) and cut; once it is filled, [hole_end, ahead_end) must lie inside a skipped body for the
// flow to be followed on (its late packets are then retransmissions of followed bytes: kept whole), else
// the flow keeps whole packets for good. A real loss never fills the hole: the wait ends at the bound.

// A packet past the hole: kept whole; the hole is what lies before the first of them.
static __always_inline u32 snap_wait_past_hole(struct snap_flow *flow, u32 seq, u32 payload_bytes) {
    if ((s32)(seq - flow->hole_end) < 0)
        flow->hole_end = seq;
    if ((s32)(seq + payload_bytes - flow->ahead_end) > 0)
        flow->ahead_end = seq + payload_bytes;
    if (flow->ahead_end - flow->hole_end > SNAP_WAIT_LIMIT)
        return snap_mark_full(flow);
    return SNAP_WHOLE;
}

// After a packet of the hole was followed: once the hole is filled, on past what was kept whole.
static __always_inline void snap_wait_filled(struct snap_flow *flow) {
    if (flow->phase == SNAP_FULL || flow->next_seq != flow->hole_end)
        return;                                      // (still waiting for the rest of the hole)
    u32 passed = flow->ahead_end - flow->hole_end;
    if (flow->phase != SNAP_BODY_SKIP || flow->remaining_bytes < passed) {
        snap_mark_full(flow);                        // the packet's own cut stands: its framing was known
        return;
    }
    flow->remaining_bytes -= passed;
    if (flow->remaining_bytes == 0)
        flow->phase = SNAP_HEADER;
    flow->next_seq = flow->ahead_end;
    flow->waiting = 0;
}

// Follow one packet of a flow this CPU holds: how many of its bytes to keep.
static __always_inline u32 snap_follow(struct __sk_buff *skb, struct snap_flow *flow, u32 seq, u32 payload_at,
                                       u32 end) {
    u32 payload_bytes = end - payload_at;
    s32 ahead = (s32)(seq - flow->next_seq);
    if ((s32)(seq + payload_bytes - flow->next_seq) <= 0)
        return SNAP_WHOLE;                           // a retransmission of bytes already followed
    if (ahead > 0) {
        if (flow->waiting)
            return snap_wait_past_hole(flow, seq, payload_bytes);
        // Bytes missing before this packet (lost, or still to come: packets of one flow reach the socket
        // out of order when the sender moves between CPUs). Inside a skipped body they are values nobody
        // reads: follow on from here, and keep the late packet whole when it comes (a "retransmission").
        if (flow->phase == SNAP_BODY_SKIP && flow->remaining_bytes > (u64)ahead) {
            flow->remaining_bytes -= ahead;
            flow->next_seq = seq;
            ahead = 0;
        } else {
            // A header may be among them: keep whole packets until they come.
            flow->waiting = 1;
            flow->hole_end = seq;
            flow->ahead_end = seq + payload_bytes;
            return SNAP_WHOLE;
        }
    }
    if (flow->waiting && (s32)(seq + payload_bytes - flow->hole_end) > 0)
        return snap_mark_full(flow);                 // the hole's bytes and more: not followed
    u32 keep = snap_payload(skb, flow, payload_at - ahead, end, payload_at);
    flow->next_seq = seq + payload_bytes;
    if (flow->waiting)
        snap_wait_filled(flow);
    if (ahead < 0)                                   // partly retransmitted: keep the old bytes too
        return SNAP_WHOLE;
    return keep;
}

static __always_inline u32 snap_tcp(struct __sk_buff *skb, struct snap_flow_key *key, u32 tcp_at, u32 end) {
    u8 tcp[14];
    if (bpf_skb_load_bytes(skb, tcp_at, tcp, sizeof(tcp)))
        return SNAP_WHOLE;
    key->src_port = ((u16)tcp[0] << 8) | tcp[1];
    key->dst_port = ((u16)tcp[2] << 8) | tcp[3];
#ifdef SNAP_PORT_WANTED
    if (!SNAP_PORT_WANTED(key->src_port) && !SNAP_PORT_WANTED(key->dst_port))
        return 0;
#endif
    u32 seq = ((u32)tcp[4] << 24) | ((u32)tcp[5] << 16) | ((u32)tcp[6] << 8) | tcp[7];
    u32 payload_at = tcp_at + (tcp[12] >> 4) * 4;
    u8 flags = tcp[13];
    if (payload_at > end)
        return SNAP_WHOLE;
    u32 payload_bytes = end - payload_at;
    if (flags & TCP_FLAG_SYN) {
        struct snap_flow fresh = {.next_seq = seq + 1, .phase = SNAP_GREETING};
        snap_flows.update(key, &fresh);
        return SNAP_WHOLE;
    }
    if (payload_bytes == 0)
        return SNAP_WHOLE;
    struct snap_flow *flow = snap_flows.lookup(key);
    if (!flow) {
        // The connection began before the capture: whole packets, counted once.
        struct snap_flow full = {.phase = SNAP_FULL};
        snap_flows.update(key, &full);
        snap_count(SNAP_FULL_FLOWS, 1);
        return SNAP_WHOLE;
    }
    if (flow->phase == SNAP_FULL)
        return SNAP_WHOLE;
    // One CPU at a time: another one holds the flow for about a microsecond at most.
    u32 tries = 0;
    while (__sync_val_compare_and_swap(&flow->busy, 0, 1) != 0) {
        if (++tries >= SNAP_LOCK_TRIES) {
            flow->conflict = 1;            // this packet is kept whole: the state misses its bytes
            return SNAP_WHOLE;
        }
    }
    u32 keep = flow->conflict ? snap_mark_full(flow) : snap_follow(skb, flow, seq, payload_at, end);
    if (flow->conflict && flow->phase != SNAP_FULL)
        snap_mark_full(flow);              // this packet's cut stands: the state was whole when it began
    __sync_lock_test_and_set(&flow->busy, 0);
    return keep;
}

int zmtp_snap(struct __sk_buff *skb) {
    u32 length = skb->len;
    // libpcap discards lo's outgoing copies (it keeps the incoming one): do not follow them twice.
    if (skb->pkt_type == PACKET_OUTGOING && skb->ifindex == SNAP_LOOPBACK_IFINDEX)
        return 0;
    struct snap_flow_key key = {};
    u32 net_at = SNAP_LINK_HEADER_LEN, tcp_at, end;
    u32 whole_or_drop = SNAP_WHOLE;
#ifdef SNAP_PORT_WANTED
    whole_or_drop = 0;                               // --ports: only TCP on those ports
#endif
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        u8 ip[20];
        if (bpf_skb_load_bytes(skb, net_at, ip, sizeof(ip)) || ip[9] != IPPROTO_TCP)
            return whole_or_drop;
        if ((ip[6] & 0x3F) || ip[7])                 // a fragment (MF or an offset)
            return SNAP_WHOLE;
        tcp_at = net_at + (ip[0] & 0x0F) * 4;
        end = net_at + (((u32)ip[2] << 8) | ip[3]);
        key.family = 4;
        __builtin_memcpy(key.src_addr, ip + 12, 4);
        __builtin_memcpy(key.dst_addr, ip + 16, 4);
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        u8 ip[40];
        if (bpf_skb_load_bytes(skb, net_at, ip, sizeof(ip)) || ip[6] != IPPROTO_TCP)
            return whole_or_drop;                    // extension headers: not followed
        tcp_at = net_at + 40;
        end = tcp_at + (((u32)ip[4] << 8) | ip[5]);
        key.family = 6;
        __builtin_memcpy(key.src_addr, ip + 8, 16);
        __builtin_memcpy(key.dst_addr, ip + 24, 16);
    } else {
        return whole_or_drop;
    }
    if (end > length || tcp_at + 20 > end)
        return SNAP_WHOLE;
    u32 keep = snap_tcp(skb, &key, tcp_at, end);
    if (keep >= length)
        return SNAP_WHOLE;
    if (keep) {
        snap_count(SNAP_PACKETS_CUT, 1);
        snap_count(SNAP_BYTES_CUT, length - keep);
    }
    return keep;
}
