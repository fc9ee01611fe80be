// libzmq API events: one event per frame handed to or taken from libzmq.
//
//   int zmq_msg_send (zmq_msg_t *msg, void *socket, int flags);   returns the frame size or -1
//   int zmq_msg_recv (zmq_msg_t *msg, void *socket, int flags);
//   int zmq_send (void *socket, const void *buf, size_t len, int flags);
//   int zmq_recv (void *socket, void *buf, size_t len, int flags);  returns the frame size (may exceed len)
//
// Every probed call traps into the kernel (a uprobe: microseconds on a virtual machine), so what is probed
// is the daemon's --zmq-events choice (sniffer/options.py says what each costs):
// - "calls": entry and return of the four. The entry probe notes the arguments per thread, the return probe
//   emits the event with the result: failed calls (EAGAIN polling, EINTR) are not messages and are not
//   reported. The event's head time is the call, `return_ts_ns` its return.
// - "sends": the entry of the two send calls only, a quarter of the traps: the size is read from the
//   zmq_msg_t (or is zmq_send's len), `return_ts_ns` is the call time, a call that then fails is reported.
// zmq_sendmsg/zmq_recvmsg (deprecated aliases that call zmq_msg_send/recv) are not probed, so nothing is
// counted twice.
struct zmq_event {
    struct event_head head;
    u64 return_ts_ns;
    u64 socket;            // the zmq socket handle: one per ZMQ socket in the process
    u64 msg;               // zmq_msg_t * (or the buffer for zmq_send/zmq_recv)
    s64 size;              // frame bytes
    s32 flags;             // flags argument (ZMQ_DONTWAIT 1, ZMQ_SNDMORE 2)
    u16 function;          // ZMQ_FN_*
    u8 more;               // 1: more frames follow, 0: last frame, 255: not known
    u8 reserved;
};
_Static_assert(sizeof(struct zmq_event) == ZMQ_EVENT_BYTES, "zmq_event differs from probe_events.py");

struct zmq_call {
    u64 ts_ns;
    u64 socket;
    u64 msg;
    s32 flags;
    u32 netns;
    u16 function;
};

struct {                                   // thread -> call in progress
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);
    __type(value, struct zmq_call);
} zmq_calls SEC(".maps");

static __always_inline int zmq_enter(u16 function, u64 socket, u64 msg, s32 flags) {
    u32 netns = task_netns();
    if (!netns_watched(netns))
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct zmq_call call = {.ts_ns = bpf_ktime_get_ns(), .socket = socket, .msg = msg, .flags = flags,
                            .netns = netns, .function = function};
    bpf_map_update_elem(&zmq_calls, &pid_tgid, &call, BPF_ANY);
    return 0;
}

static __always_inline int zmq_exit(struct pt_regs *ctx, u16 kind) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct zmq_call *call = bpf_map_lookup_elem(&zmq_calls, &pid_tgid);
    if (!call)
        return 0;
    struct zmq_call done = *call;
    bpf_map_delete_elem(&zmq_calls, &pid_tgid);
    s64 size = (int)PT_REGS_RC(ctx);
    if (size < 0)
        return 0;
    struct zmq_event *event = bpf_ringbuf_reserve(&events, sizeof(struct zmq_event), 0);
    if (!event) {
        count_lost(kind);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    fill_head(&event->head, kind, done.netns);
    event->return_ts_ns = event->head.ts_ns;
    event->head.ts_ns = done.ts_ns;
    event->socket = done.socket;
    event->msg = done.msg;
    event->size = size;
    event->flags = done.flags;
    event->function = done.function;
    if (done.function == ZMQ_FN_MSG_SEND || done.function == ZMQ_FN_SEND) {
        event->more = (done.flags & ZMQ_SNDMORE_FLAG) ? 1 : 0;
    } else if (done.function == ZMQ_FN_MSG_RECV) {
        // libzmq 4.2 and 4.3 keep the frame's flags byte at this offset of the 64-byte zmq_msg_t
        // (msg.hpp: metadata pointer, 34 unused bytes, type, flags); bit 0 is `more`.
        u8 msg_flags = 0;
        bpf_probe_read_user(&msg_flags, sizeof(msg_flags), (char *)done.msg + ZMQ_MSG_FLAGS_OFFSET);
        event->more = msg_flags & 1;
    } else {
        event->more = 255;     // zmq_recv copies into a buffer: the flag stays inside libzmq
    }
    bpf_ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}

// zmq_msg_t (libzmq 4.2 and 4.3 msg.hpp: a 64-byte union): the message type at byte 42 says where the
// size is: in the message (vsm: byte 41), after the data pointer (cmsg: bytes 16-23), or in the content it
// points to (lmsg, zclmsg: content_t { void *data; size_t size; ... } at bytes 8-15).
#define ZMQ_MSG_TYPE_OFFSET 42
#define ZMQ_MSG_VSM 101
#define ZMQ_MSG_LMSG 102
#define ZMQ_MSG_CMSG 104
#define ZMQ_MSG_ZCLMSG 105
static __always_inline s64 zmq_msg_size_at_entry(u64 msg) {
    u8 type = 0;
    bpf_probe_read_user(&type, sizeof(type), (char *)msg + ZMQ_MSG_TYPE_OFFSET);
    if (type == ZMQ_MSG_VSM) {
        u8 size = 0;
        bpf_probe_read_user(&size, sizeof(size), (char *)msg + ZMQ_MSG_TYPE_OFFSET - 1);
        return size;
    }
    u64 size = 0;
    if (type == ZMQ_MSG_CMSG) {
        bpf_probe_read_user(&size, sizeof(size), (char *)msg + 16);
    } else if (type == ZMQ_MSG_LMSG || type == ZMQ_MSG_ZCLMSG) {
        u64 content = 0;
        bpf_probe_read_user(&content, sizeof(content), (char *)msg + 8);
        bpf_probe_read_user(&size, sizeof(size), (char *)content + 8);
    }
    return size;
}

static __always_inline int zmq_sent(u16 function, u64 socket, u64 msg, s64 size, s32 flags) {
    u32 netns = task_netns();
    if (!netns_watched(netns))
        return 0;
    struct zmq_event *event = bpf_ringbuf_reserve(&events, sizeof(struct zmq_event), 0);
    if (!event) {
        count_lost(KIND_ZMQ_SEND);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    fill_head(&event->head, KIND_ZMQ_SEND, netns);
    event->return_ts_ns = event->head.ts_ns;
    event->socket = socket;
    event->msg = msg;
    event->size = size;
    event->flags = flags;
    event->function = function;
    event->more = (flags & ZMQ_SNDMORE_FLAG) ? 1 : 0;
    bpf_ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}

SEC("uprobe")
int zmq_msg_send_sent(struct pt_regs *ctx) {
    return zmq_sent(ZMQ_FN_MSG_SEND, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), zmq_msg_size_at_entry(PT_REGS_PARM1(ctx)),
                    (s32)PT_REGS_PARM3(ctx));
}

SEC("uprobe")
int zmq_send_sent(struct pt_regs *ctx) {
    return zmq_sent(ZMQ_FN_SEND, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), (s64)PT_REGS_PARM3(ctx),
                    (s32)PT_REGS_PARM4(ctx));
}

SEC("uprobe")
int zmq_msg_send_enter(struct pt_regs *ctx) {
    return zmq_enter(ZMQ_FN_MSG_SEND, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), (s32)PT_REGS_PARM3(ctx));
}

SEC("uprobe")
int zmq_msg_recv_enter(struct pt_regs *ctx) {
    return zmq_enter(ZMQ_FN_MSG_RECV, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), (s32)PT_REGS_PARM3(ctx));
}

SEC("uprobe")
int zmq_send_enter(struct pt_regs *ctx) {
    return zmq_enter(ZMQ_FN_SEND, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), (s32)PT_REGS_PARM4(ctx));
}

SEC("uprobe")
int zmq_recv_enter(struct pt_regs *ctx) {
    return zmq_enter(ZMQ_FN_RECV, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), (s32)PT_REGS_PARM4(ctx));
}

SEC("uprobe")
int zmq_send_return(struct pt_regs *ctx) {
    return zmq_exit(ctx, KIND_ZMQ_SEND);
}

SEC("uprobe")
int zmq_recv_return(struct pt_regs *ctx) {
    return zmq_exit(ctx, KIND_ZMQ_RECV);
}
