// The snap filter: a socket filter on the daemon's packet socket that cuts each packet right after the
// last byte the decoders need (TCP/IP headers, ZMTP greetings, every ZMTP frame header, the bodies of
// command frames, of each message's first SNAP_KEPT_FIRST_FRAMES data frames (ps-lite's routing id, meta and
// keys: kept whatever their size) and of the other data frames up to SNAP_KEPT_BODY_MAX: the rule the
// decoders keep bodies by (decoders/protocols/__init__.py ZMTP_KEPT_BODIES), so a cut never takes a byte they
// read). Its return value is the number of bytes the packet socket keeps: 0 drops the packet, the packet's
// length keeps it whole. The wire length in the pcap record stays the packet's length.
//
// Plain BPF C for clang's BPF target, built once (sniffer/bpf_objects.py, by `make setup`) with these -D flags:
//   SNAP_KEPT_FIRST_FRAMES  a message's first data frames whose bodies are always kept (ZMTP_KEPT_BODIES)
//   SNAP_KEPT_BODY_MAX      later data frames keep their body up to this size (ZMTP_KEPT_BODIES)
//   SNAP_STORE_CHUNKS       chunks of SNAP_CHUNK_BYTES for bytes past holes, all flows together
//   SNAP_WAIT_LIMIT         bytes past a hole one flow may store while it waits
// and loaded by libbpf (sniffer/snap_filter.py) with the run's choices as read-only data, known to the verifier:
//   snap_link_header_len    bytes before the network header in what the socket sees (cooked: 0, Ethernet: 14)
//   snap_ports_filtered     (--ports) 1: other TCP ports, and other packets, are dropped
//   snap_ports_wanted       (--ports) a bit per TCP port: the ports to capture
//
// Per TCP direction the filter follows the ZMTP 3.x framing by sequence number, from the SYN on, one frame
// per bpf_loop() step. Packets of a flow can reach the socket out of order (on veth pairs, packets of one
// flow are handled on two CPUs when the sender moves), and a lost segment comes back later, retransmitted.
// A hole that lies inside a frame body is passed over by arithmetic (the late packet is then kept whole).
// A hole that may hold a frame header makes the filter wait: the packets past it are kept whole and their
// bytes stored (snap_chunks); the late packets that fill the hole are followed and cut, and once it is filled
// the framing is walked through the stored bytes, so the flow is followed on from there, whatever the
// reordering. What cannot be known keeps a direction whole for good: no SYN seen, a stream that is not ZMTP
// 3.x, flags ZMTP does not define, and a frame header among bytes that went by unstored (past
// SNAP_WAIT_LIMIT, past SNAP_AHEAD_RANGES separate stretches, or pushed out of a full store). Packets at or
// before the followed position (retransmissions, late packets) are kept whole.
//
// The loops' changing numbers live in a per-CPU map value (snap_walks), not on the stack: the verifier
// does not follow a map value's contents, so each bpf_loop callback is verified in a few passes.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/types.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;


#define SNAP_WHOLE 0xFFFFFFFFu
#define SNAP_LOOPBACK_IFINDEX 1            // every namespace's lo (net/core/dev.c LOOPBACK_IFINDEX)
#define ZMTP_GREETING_LEN 64
#define SNAP_LOCK_TRIES (1u << 16)         // attempts to take a flow another CPU holds
#define SNAP_WALK_STEPS (1u << 23)         // bpf_loop's own bound: more frames than a walk can hold
#define SNAP_AHEAD_RANGES 16               // separate stretches of stored bytes per waiting flow
#define SNAP_CHUNK_BYTES 4096
#define SNAP_CHUNK_SHIFT 12
#define SNAP_COPY_BYTES 256                // bytes copied into a chunk per bpf_skb_load_bytes
#define SNAP_PACKET_MAX 65536              // bytes in a packet the socket sees (a GSO/GRO one included)
#define ZMTP_FLAG_MORE 0x01
#define ZMTP_FLAG_LONG 0x02                // ZMTP 3.x: LONG => 8-byte big-endian size, else 1 byte
#define ZMTP_FLAG_COMMAND 0x04
#define ZMTP_FLAGS_DEFINED (ZMTP_FLAG_MORE | ZMTP_FLAG_LONG | ZMTP_FLAG_COMMAND)
#define TCP_FLAG_SYN 0x02

const volatile u32 snap_link_header_len = 0;
const volatile u32 snap_ports_filtered = 0;
const volatile u8 snap_ports_wanted[65536 / 8] = {};

static __always_inline int snap_port_wanted(u16 port) {
    return (snap_ports_wanted[port >> 3] >> (port & 7)) & 1;
}

// snap_counts, in sniffer/snap_filter.py SNAP_COUNTERS order
enum snap_counter { SNAP_PACKETS_CUT, SNAP_BYTES_CUT, SNAP_FULL_FLOWS, SNAP_WAITS, SNAP_RESUMED, SNAP_COUNTER_COUNT };
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
    u64 busy;                              // 1 while a CPU follows the flow (packets of one flow can be
                                           // handled on two CPUs at once: the state has one writer at a time)
    u32 next_seq;                          // TCP sequence number of the next stream byte to follow
    u32 stream_offset;                     // SNAP_GREETING: greeting bytes seen
    // waiting for a hole: the bytes past it are stored at (seq - ahead_base) in the chunks of this wait
    u32 ahead_base;
    u32 generation;                        // of the current wait: chunks of earlier ones are never read
    u32 unstored_from;                     // (with unstored) bytes past the hole that went by unstored
    u32 unstored_to;                       // lie within [unstored_from, unstored_to)
    u32 ranges[SNAP_AHEAD_RANGES][2];      // stored [start, end) offsets from ahead_base, in order, apart
    u8 range_count;
    u8 waiting;
    u8 unstored;
    u8 phase;
    u8 frame_index;                        // data frames of the current message before this one (max 255)
    u8 header_bytes;                       // SNAP_HEADER: bytes of a frame header that straddles packets
    u8 header[9];                          // flags, size (1 or 8 bytes)
};

struct snap_chunk_key {
    struct snap_flow_key flow;
    u32 generation;
    u32 index;                             // (offset from ahead_base) / SNAP_CHUNK_BYTES
};

struct snap_chunk {
    u8 bytes[SNAP_CHUNK_BYTES + SNAP_COPY_BYTES];   // the slack: a masked copy never leaves the value
};

// What a walk or a copy is at (a per-CPU map value: see the top).
struct snap_walk_state {
    struct snap_chunk_key chunk_key;
    u32 cursor;                            // walk: next byte, a packet offset or an offset from ahead_base
    u32 end;
    u32 keep;                              // packet walk: keep the bytes before this
    u32 failed;                            // the bytes are not ZMTP framing (or no longer stored)
    u32 from;                              // copy: packet offset
    u32 to;                                // copy: offset from ahead_base
    u32 left;                              // copy: bytes still to store
    u32 kept[SNAP_AHEAD_RANGES][2];        // adding a stored range: the ranges it does not touch, in order
    u32 merge_start;                       // adding a stored range: the range, grown by those it touches
    u32 merge_end;
    u32 merge_kept;                        // ranges in kept
    u32 merge_placed;                      // putting back: the merged range is in place
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct snap_flow_key);
    __type(value, struct snap_flow);
} snap_flows SEC(".maps");

struct {                                   // bytes past holes; the least recently used go when it is full
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, SNAP_STORE_CHUNKS);
    __type(key, struct snap_chunk_key);
    __type(value, struct snap_chunk);
} snap_chunks SEC(".maps");

struct {                                   // what a new chunk is made from (never written)
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct snap_chunk);
} snap_chunk_blank SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct snap_walk_state);
} snap_walks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, SNAP_COUNTER_COUNT);
    __type(key, u32);
    __type(value, u64);
} snap_counts SEC(".maps");

static __always_inline void snap_count(u32 counter, u64 amount) {
    u64 *slot = bpf_map_lookup_elem(&snap_counts, &counter);
    if (slot)
        *slot += amount;
}

static __always_inline u32 snap_mark_full(struct snap_flow *flow) {
    if (flow->phase != SNAP_FULL) {
        flow->phase = SNAP_FULL;
        snap_count(SNAP_FULL_FLOWS, 1);
    }
    return SNAP_WHOLE;
}

// -- walking the framing -----------------------------------------------------------------------------------

// The callbacks' context: pointers only (they do not change from step to step).
struct snap_walk {
    struct __sk_buff *skb;
    struct snap_flow *flow;
    struct snap_walk_state *state;
};

// Bytes of the packet, or of the chunk of stored bytes a step reads (it never reads past the chunk's end).
static __always_inline int snap_load(struct snap_walk *walk, struct snap_chunk *chunk, u32 at, u8 *to, u32 bytes) {
    if (!chunk)
        return bpf_skb_load_bytes(walk->skb, at, to, bytes);
    for (u32 i = 0; i < 8; i++) {
        if (i >= bytes)
            break;
        to[i] = chunk->bytes[(at + i) & (SNAP_CHUNK_BYTES - 1)];
    }
    return 0;
}

// The greeting's bytes at the cursor, up to `end` (it may come in several segments: libzmq sends the
// signature, then the version, then the rest). Sets `failed` when the stream is not ZMTP 3.x.
static __always_inline void snap_greeting(struct snap_walk *walk, struct snap_chunk *chunk, u32 end) {
    struct snap_flow *flow = walk->flow;
    struct snap_walk_state *state = walk->state;
    u32 offset = flow->stream_offset;
    u32 count = ZMTP_GREETING_LEN - offset;
    if (count > end - state->cursor)
        count = end - state->cursor;
    u8 byte = 0;
    // signature: 0xFF, 8 padding bytes, 0x7F; then the major version
    if ((offset == 0 && (snap_load(walk, chunk, state->cursor, &byte, 1) || byte != 0xFF)) ||
        (offset <= 9 && 9 < offset + count && (snap_load(walk, chunk, state->cursor + 9 - offset, &byte, 1) || byte != 0x7F)) ||
        (offset <= 10 && 10 < offset + count && (snap_load(walk, chunk, state->cursor + 10 - offset, &byte, 1) || byte != 3))) {
        state->failed = 1;
        return;
    }
    flow->stream_offset = offset + count;
    state->cursor += count;
    state->keep = state->cursor;
    if (flow->stream_offset == ZMTP_GREETING_LEN)
        flow->phase = SNAP_HEADER;
}

// One frame header at the cursor, up to `end`, possibly completing bytes read before. Returns 1 when the
// header is complete (phase set for its body), 0 when the bytes ended inside it; sets `failed` when the
// flags are not ZMTP's.
static __always_inline int snap_header(struct snap_walk *walk, struct snap_chunk *chunk, u32 end) {
    struct snap_flow *flow = walk->flow;
    struct snap_walk_state *state = walk->state;
    u8 *header = flow->header;
    u32 have = flow->header_bytes;
    if (have == 0) {
        if (snap_load(walk, chunk, state->cursor, header, 1) || header[0] & ~ZMTP_FLAGS_DEFINED) {
            state->failed = 1;
            return 0;
        }
        have = 1;
        state->cursor += 1;
    }
    u32 need = header[0] & ZMTP_FLAG_LONG ? 9 : 2;
    if (have == 1 && end - state->cursor >= need - 1) {
        // the common case: the size bytes are all here
        if (need == 9 ? snap_load(walk, chunk, state->cursor, header + 1, 8)
                      : snap_load(walk, chunk, state->cursor, header + 1, 1)) {
            state->failed = 1;
            return 0;
        }
        state->cursor += need - 1;
        have = need;
    } else {
        for (u32 i = 0; i < 8 && have < need && state->cursor < end; i++) {
            // have is 1..8 here; the mask shows the verifier the byte stays inside header[1..8]
            if (snap_load(walk, chunk, state->cursor, header + 1 + ((have - 1) & 7), 1)) {
                state->failed = 1;
                return 0;
            }
            have += 1;
            state->cursor += 1;
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
    if (size >> 62) {
        state->failed = 1;
        return 0;
    }
    flow->remaining_bytes = size;
    u8 flags = header[0];
    flow->phase = flags & ZMTP_FLAG_COMMAND || flow->frame_index < SNAP_KEPT_FIRST_FRAMES || size <= SNAP_KEPT_BODY_MAX
                  ? SNAP_BODY_KEEP : SNAP_BODY_SKIP;
    if (!(flags & ZMTP_FLAG_COMMAND))
        flow->frame_index = !(flags & ZMTP_FLAG_MORE) ? 0 : flow->frame_index < 255 ? flow->frame_index + 1 : 255;
    return 1;
}

// One bpf_loop step: the greeting, or one frame (its header, then as much of its body as is here). Stored
// bytes are read a chunk at a time: a header across two chunks is completed as one across two packets is.
// Returns 1 to stop: the bytes ended or are not ZMTP.
static __always_inline long snap_step(struct snap_walk *walk, int from_store) {
    struct snap_flow *flow = walk->flow;
    struct snap_walk_state *state = walk->state;
    if (state->cursor >= state->end || state->failed)
        return 1;
    u32 end = state->end;                    // of the bytes this step may read
    struct snap_chunk *chunk = 0;
    if (from_store) {
        u32 index = state->cursor >> SNAP_CHUNK_SHIFT;
        state->chunk_key.index = index;
        chunk = bpf_map_lookup_elem(&snap_chunks, &state->chunk_key);
        if (!chunk) {                        // pushed out of a full store
            state->failed = 1;
            return 1;
        }
        if (end > (index + 1) << SNAP_CHUNK_SHIFT)
            end = (index + 1) << SNAP_CHUNK_SHIFT;
    }
    if (flow->phase == SNAP_GREETING) {
        snap_greeting(walk, chunk, end);
        return 0;
    }
    if (flow->phase == SNAP_HEADER) {
        int done = snap_header(walk, chunk, end);
        state->keep = state->cursor;
        if (!done)
            return state->failed || state->cursor >= state->end;
    }
    u64 count = state->end - state->cursor;
    if (flow->remaining_bytes < count)
        count = flow->remaining_bytes;
    state->cursor += count;
    flow->remaining_bytes -= count;
    if (flow->phase == SNAP_BODY_KEEP)
        state->keep = state->cursor;
    if (flow->remaining_bytes == 0)
        flow->phase = SNAP_HEADER;
    return 0;
}

static long snap_packet_step(u32 index, void *walk) {
    return snap_step(walk, 0);
}

static long snap_store_step(u32 index, void *walk) {
    return snap_step(walk, 1);
}

static __always_inline struct snap_walk_state *snap_state(void) {
    u32 zero = 0;
    return bpf_map_lookup_elem(&snap_walks, &zero);
}

// Walk the stream bytes [cursor, end) of the packet; returns how many of its bytes to keep (the headers
// before the payload, `keep`, at least), or SNAP_WHOLE when they are not ZMTP.
static __always_inline u32 snap_walk_packet(struct __sk_buff *skb, struct snap_flow *flow, u32 cursor, u32 end,
                                            u32 keep) {
    struct snap_walk_state *state = snap_state();
    if (!state)
        return snap_mark_full(flow);
    state->cursor = cursor;
    state->end = end;
    state->keep = keep;
    state->failed = 0;
    struct snap_walk walk = {.skb = skb, .flow = flow, .state = state};
    bpf_loop(SNAP_WALK_STEPS, snap_packet_step, &walk, 0);
    return state->failed ? snap_mark_full(flow) : state->keep;
}

// Walk the stored bytes [from, to) (offsets from ahead_base); the flow is kept whole if they are not ZMTP
// or no longer stored.
static __always_inline void snap_walk_store(struct snap_flow_key *key, struct snap_flow *flow, u32 from, u32 to) {
    struct snap_walk_state *state = snap_state();
    if (!state) {
        snap_mark_full(flow);
        return;
    }
    state->chunk_key.flow = *key;
    state->chunk_key.generation = flow->generation;
    state->cursor = from;
    state->end = to;
    state->failed = 0;
    struct snap_walk walk = {.flow = flow, .state = state};
    bpf_loop(SNAP_WALK_STEPS, snap_store_step, &walk, 0);
    if (state->failed)
        snap_mark_full(flow);
}

// -- waiting for a hole ------------------------------------------------------------------------------------

// `count` bytes from the followed position passed over by arithmetic: possible inside a frame body only.
static __always_inline int snap_skip_body(struct snap_flow *flow, u32 count) {
    if ((flow->phase != SNAP_BODY_KEEP && flow->phase != SNAP_BODY_SKIP) || flow->remaining_bytes < count)
        return 0;
    flow->remaining_bytes -= count;
    flow->next_seq += count;
    if (flow->remaining_bytes == 0)
        flow->phase = SNAP_HEADER;
    return 1;
}

// One bpf_loop step of storing a packet's bytes: up to SNAP_COPY_BYTES, within one chunk.
static long snap_copy_step(u32 index, void *ctx) {
    struct snap_walk *walk = ctx;
    struct snap_walk_state *state = walk->state;
    if (state->left == 0)
        return 1;
    state->chunk_key.index = state->to >> SNAP_CHUNK_SHIFT;
    struct snap_chunk *chunk = bpf_map_lookup_elem(&snap_chunks, &state->chunk_key);
    if (!chunk) {
        u32 zero = 0;
        struct snap_chunk *blank = bpf_map_lookup_elem(&snap_chunk_blank, &zero);
        if (!blank || bpf_map_update_elem(&snap_chunks, &state->chunk_key, blank, BPF_ANY))
            return 1;
        chunk = bpf_map_lookup_elem(&snap_chunks, &state->chunk_key);
        if (!chunk)
            return 1;
    }
    u32 at = state->to & (SNAP_CHUNK_BYTES - 1);
    u32 bytes = SNAP_CHUNK_BYTES - at;
    if (bytes > SNAP_COPY_BYTES)
        bytes = SNAP_COPY_BYTES;
    if (bytes > state->left)
        bytes = state->left;
    if (bytes == 0 || bytes > SNAP_COPY_BYTES || bpf_skb_load_bytes(walk->skb, state->from, chunk->bytes + at, bytes))
        return 1;
    state->from += bytes;
    state->to += bytes;
    state->left -= bytes;
    return 0;
}

// Noting [start, end) as stored: merged with the ranges it touches. Ranges are few: they are taken out one by
// one (the ones it does not touch kept aside, in order, the ones it touches merged into it), then put back with
// the merged one in its place: a bpf_loop step per range each time, so that the verifier goes through a step
// once, not once per range. What changes from step to step is in the walk state (a map value), not on the
// stack: a count on the stack is a known number to the verifier, which then verifies the step once per value.
struct snap_merge {
    struct snap_flow *flow;
    struct snap_walk_state *state;
};

static long snap_take_range_step(u32 index, void *ctx) {
    struct snap_merge *merge = ctx;
    struct snap_flow *flow = merge->flow;
    struct snap_walk_state *state = merge->state;
    if (index >= flow->range_count)
        return 1;
    u32 range_start = flow->ranges[index & (SNAP_AHEAD_RANGES - 1)][0];
    u32 range_end = flow->ranges[index & (SNAP_AHEAD_RANGES - 1)][1];
    if (range_end < state->merge_start || range_start > state->merge_end) {
        u32 at = state->merge_kept & (SNAP_AHEAD_RANGES - 1);
        state->kept[at][0] = range_start;
        state->kept[at][1] = range_end;
        state->merge_kept++;
    } else {
        state->merge_start = range_start < state->merge_start ? range_start : state->merge_start;
        state->merge_end = range_end > state->merge_end ? range_end : state->merge_end;
    }
    return 0;
}

static long snap_put_range_step(u32 index, void *ctx) {
    struct snap_merge *merge = ctx;
    struct snap_flow *flow = merge->flow;
    struct snap_walk_state *state = merge->state;
    if (index > state->merge_kept)
        return 1;
    u32 at = index & (SNAP_AHEAD_RANGES - 1);
    if (!state->merge_placed && (index == state->merge_kept || state->kept[at][0] > state->merge_end)) {
        flow->ranges[at][0] = state->merge_start;
        flow->ranges[at][1] = state->merge_end;
        state->merge_placed = 1;
    } else {
        u32 from = (index - state->merge_placed) & (SNAP_AHEAD_RANGES - 1);
        flow->ranges[at][0] = state->kept[from][0];
        flow->ranges[at][1] = state->kept[from][1];
    }
    return 0;
}

// 0 when there is no slot left.
static __always_inline int snap_add_range(struct snap_flow *flow, struct snap_walk_state *state, u32 start, u32 end) {
    struct snap_merge merge = {.flow = flow, .state = state};
    state->merge_start = start;
    state->merge_end = end;
    state->merge_kept = 0;
    state->merge_placed = 0;
    bpf_loop(SNAP_AHEAD_RANGES, snap_take_range_step, &merge, 0);
    u32 kept = state->merge_kept;
    if (kept >= SNAP_AHEAD_RANGES)
        return 0;
    bpf_loop(SNAP_AHEAD_RANGES, snap_put_range_step, &merge, 0);
    flow->range_count = kept + 1;
    return 1;
}

static __always_inline void snap_drop_first_range(struct snap_flow *flow) {
    for (u32 i = 0; i + 1 < SNAP_AHEAD_RANGES; i++) {
        flow->ranges[i][0] = flow->ranges[i + 1][0];
        flow->ranges[i][1] = flow->ranges[i + 1][1];
    }
    if (flow->range_count)
        flow->range_count -= 1;
}

static __always_inline void snap_wait_begin(struct snap_flow *flow) {
    flow->waiting = 1;
    flow->generation += 1;
    flow->ahead_base = flow->next_seq;
    flow->range_count = 0;
    flow->unstored = 0;
    snap_count(SNAP_WAITS, 1);
}

// A packet past the hole: kept whole, its bytes stored when they can be.
static __always_inline u32 snap_wait_past_hole(struct __sk_buff *skb, struct snap_flow_key *key, struct snap_flow *flow,
                                               u32 seq, u32 payload_at, u32 payload_bytes) {
    u32 start = seq - flow->ahead_base, end = start + payload_bytes;
    struct snap_walk_state *state = snap_state();
    if (state && end <= SNAP_WAIT_LIMIT) {
        state->chunk_key.flow = *key;
        state->chunk_key.generation = flow->generation;
        state->from = payload_at;
        state->to = start;
        state->left = payload_bytes;
        struct snap_walk walk = {.skb = skb, .flow = flow, .state = state};
        // a step per SNAP_COPY_BYTES, and one more per chunk the packet touches
        bpf_loop(SNAP_PACKET_MAX / SNAP_COPY_BYTES + SNAP_PACKET_MAX / SNAP_CHUNK_BYTES + 2, snap_copy_step, &walk, 0);
        if (state->left == 0 && snap_add_range(flow, state, start, end))
            return SNAP_WHOLE;
    }
    if (!flow->unstored || (s32)(seq - flow->unstored_from) < 0)
        flow->unstored_from = seq;
    if (!flow->unstored || (s32)(seq + payload_bytes - flow->unstored_to) > 0)
        flow->unstored_to = seq + payload_bytes;
    flow->unstored = 1;
    return SNAP_WHOLE;
}

// After the followed position moved: on through the stored bytes as far as they reach, and past holes that
// lie inside a body. Ends the wait once everything kept whole past the hole is behind.
struct snap_resume {
    struct snap_flow_key *key;
    struct snap_flow *flow;
    u32 hole_open;                               // a hole still open before the next range
};

// One bpf_loop turn of resuming: drops a range or the unstored bytes, or stops (returns 1). A callback of its
// own, so that the verifier goes through a turn once, not once per turn.
static long snap_resume_step(u32 index, void *ctx) {
    struct snap_resume *resume = ctx;
    struct snap_flow *flow = resume->flow;
    if (flow->phase == SNAP_FULL)
        return 1;
    if (flow->unstored && (s32)(flow->next_seq - flow->unstored_from) >= 0) {
        // at bytes that went by unstored: passed over only inside a body
        if ((s32)(flow->unstored_to - flow->next_seq) > 0 &&
            !snap_skip_body(flow, flow->unstored_to - flow->next_seq)) {
            snap_mark_full(flow);
            return 1;
        }
        flow->unstored = 0;
        return 0;
    }
    if (flow->range_count == 0)
        return 1;
    u32 position = flow->next_seq - flow->ahead_base;
    u32 start = flow->ranges[0][0], end = flow->ranges[0][1];
    if ((s32)(end - position) > 0) {
        if ((s32)(start - position) > 0 && !snap_skip_body(flow, start - position)) {
            resume->hole_open = 1;
            return 1;
        }
        snap_walk_store(resume->key, flow, flow->next_seq - flow->ahead_base, end);
        flow->next_seq = flow->ahead_base + end;
    }
    snap_drop_first_range(flow);
    return 0;
}

static __always_inline void snap_wait_resume(struct snap_flow_key *key, struct snap_flow *flow) {
    struct snap_resume resume = {.key = key, .flow = flow};
    bpf_loop(SNAP_AHEAD_RANGES + 2, snap_resume_step, &resume, 0);
    if (resume.hole_open)
        return;
    if (flow->phase != SNAP_FULL) {
        if (flow->range_count || flow->unstored)
            return;                                  // bytes before the unstored ones are still to come
        snap_count(SNAP_RESUMED, 1);
    }
    flow->waiting = 0;                               // (its chunks go as the store needs room)
}

// -- one packet --------------------------------------------------------------------------------------------

// Follow one packet of a flow this CPU holds: how many of its bytes to keep.
static __always_inline u32 snap_follow(struct __sk_buff *skb, struct snap_flow_key *key, struct snap_flow *flow,
                                       u32 seq, u32 payload_at, u32 end) {
    u32 payload_bytes = end - payload_at;
    s32 ahead = (s32)(seq - flow->next_seq);
    if ((s32)(seq + payload_bytes - flow->next_seq) <= 0)
        return SNAP_WHOLE;                           // a retransmission of bytes already followed
    if (ahead > 0 && !flow->waiting) {
        // Bytes missing before this packet (lost, or still to come: packets of one flow reach the socket
        // out of order when the sender moves between CPUs). Inside a body they are bytes no framing is in:
        // follow on from here, and keep the late packet whole when it comes (a "retransmission").
        if (snap_skip_body(flow, ahead))
            ahead = 0;
        else
            snap_wait_begin(flow);
    }
    if (ahead > 0)
        return snap_wait_past_hole(skb, key, flow, seq, payload_at, payload_bytes);
    // The packet holds the followed position (ahead <= 0): walk it from there. Most packets of a job lie
    // inside one large body: they are passed over by arithmetic, without a walk.
    if (ahead == 0 && !flow->waiting && (flow->phase == SNAP_BODY_KEEP || flow->phase == SNAP_BODY_SKIP) &&
        flow->remaining_bytes >= payload_bytes) {
        u32 keep = flow->phase == SNAP_BODY_SKIP ? payload_at : end;    // as the walk would
        snap_skip_body(flow, payload_bytes);
        return keep;
    }
    u32 keep = snap_walk_packet(skb, flow, payload_at - ahead, end, payload_at);
    flow->next_seq = seq + payload_bytes;
    if (flow->waiting) {
        // bytes of this packet that were stored already (it overlaps a packet kept whole): keep it whole too
        if (flow->range_count && (s32)(flow->next_seq - (flow->ahead_base + flow->ranges[0][0])) > 0)
            keep = SNAP_WHOLE;
        if (flow->phase != SNAP_FULL)
            snap_wait_resume(key, flow);
    }
    if (ahead < 0)                                   // partly retransmitted: keep the old bytes too
        return SNAP_WHOLE;
    return keep;
}

struct snap_lock {
    struct snap_flow *flow;
    u32 taken;
};

static long snap_lock_step(u32 index, void *ctx) {
    struct snap_lock *lock = ctx;
    lock->taken = __sync_val_compare_and_swap(&lock->flow->busy, 0, 1) == 0;
    return lock->taken;
}

static __always_inline u32 snap_tcp(struct __sk_buff *skb, struct snap_flow_key *key, u32 tcp_at, u32 end) {
    u8 tcp[14];
    if (bpf_skb_load_bytes(skb, tcp_at, tcp, sizeof(tcp)))
        return SNAP_WHOLE;
    key->src_port = ((u16)tcp[0] << 8) | tcp[1];
    key->dst_port = ((u16)tcp[2] << 8) | tcp[3];
    if (snap_ports_filtered && !snap_port_wanted(key->src_port) && !snap_port_wanted(key->dst_port))
        return 0;
    u32 seq = ((u32)tcp[4] << 24) | ((u32)tcp[5] << 16) | ((u32)tcp[6] << 8) | tcp[7];
    u32 payload_at = tcp_at + (tcp[12] >> 4) * 4;
    u8 flags = tcp[13];
    if (payload_at > end)
        return SNAP_WHOLE;
    if (flags & TCP_FLAG_SYN) {
        struct snap_flow fresh = {.next_seq = seq + 1, .phase = SNAP_GREETING};
        bpf_map_update_elem(&snap_flows, key, &fresh, BPF_ANY);
        return SNAP_WHOLE;
    }
    if (payload_at == end)
        return SNAP_WHOLE;
    struct snap_flow *flow = bpf_map_lookup_elem(&snap_flows, key);
    if (!flow) {
        // The connection began before the capture: whole packets, counted once.
        struct snap_flow full = {.phase = SNAP_FULL};
        bpf_map_update_elem(&snap_flows, key, &full, BPF_ANY);
        snap_count(SNAP_FULL_FLOWS, 1);
        return SNAP_WHOLE;
    }
    if (flow->phase == SNAP_FULL)
        return SNAP_WHOLE;
    // One CPU at a time: another one holds the flow while it walks a packet or what it stored (mostly free:
    // tried once before the loop of tries).
    struct snap_lock lock = {.flow = flow, .taken = __sync_val_compare_and_swap(&flow->busy, 0, 1) == 0};
    if (!lock.taken)
        bpf_loop(SNAP_LOCK_TRIES, snap_lock_step, &lock, 0);
    if (!lock.taken)
        return snap_mark_full(flow);       // this packet is kept whole and its bytes were not followed
    u32 keep = flow->phase == SNAP_FULL ? SNAP_WHOLE : snap_follow(skb, key, flow, seq, payload_at, end);
    __sync_lock_test_and_set(&flow->busy, 0);
    return keep;
}

SEC("socket")
int zmtp_snap(struct __sk_buff *skb) {
    u32 length = skb->len;
    // libpcap discards lo's outgoing copies (it keeps the incoming one): do not follow them twice.
    if (skb->pkt_type == PACKET_OUTGOING && skb->ifindex == SNAP_LOOPBACK_IFINDEX)
        return 0;
    struct snap_flow_key key = {};
    u32 net_at = snap_link_header_len, tcp_at, end;
    u32 whole_or_drop = snap_ports_filtered ? 0 : SNAP_WHOLE;     // --ports: only TCP on those ports
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

char LICENSE[] SEC("license") = "Dual BSD/GPL";
