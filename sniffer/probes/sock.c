// Flow -> process attribution from one tracepoint (this kernel kind has no kprobes), off the data path: a
// job's send() and recv() calls run no probe.
//
// sock:inet_sock_set_state gives every TCP state change with the socket address and its 4-tuple. The
// CLOSE -> SYN_SENT change runs inside connect(), and CLOSE -> LISTEN inside listen(), so their task is the
// connecting / listening process; the other changes often run in softirq context, where the current task is
// whoever was interrupted. A connection accepted here belongs to the owner of the listening socket on its
// port (decoders/inputs/flow_owners.py).
//
// No syscall tracepoint: enabling any one of them sends every system call of every process through the
// kernel's slow path (0.14 us more per call measured here, 29 % of a bare getppid()), and ZeroMQ jobs make
// many. (sock:sock_send_length / sock_recv_length would name the process doing I/O on each socket, but they
// run on every send and recv of every process.)
#define SOCK_AF_INET 2                   // <sys/socket.h>
#define SOCK_IPPROTO_TCP 6               // <linux/in.h>

struct sock_event {
    struct event_head head;
    u64 skaddr;            // kernel address of the struct sock: joins the events of one connection
    u16 family;            // AF_INET / AF_INET6
    u16 sport;             // local port, host order (0 before connect() picked one)
    u16 dport;             // remote port, host order
    u8 oldstate;           // TCP_* states (SOCK_STATE only)
    u8 newstate;
    u8 saddr[16];          // local address (IPv4: first 4 bytes)
    u8 daddr[16];          // remote address (IPv4: first 4 bytes)
    s32 fd;                // SOCK_ACCEPT: the new descriptor
    u32 reserved;
};
_Static_assert(sizeof(struct sock_event) == SOCK_EVENT_BYTES, "sock_event differs from probe_events.py");

SEC("tracepoint/sock/inet_sock_set_state")
int sock_state(struct trace_event_raw_inet_sock_set_state *args) {
    if (args->protocol != SOCK_IPPROTO_TCP)
        return 0;
    u32 netns = sock_netns(args->skaddr);
    if (!netns_watched(netns))
        return 0;
    struct sock_event *event = bpf_ringbuf_reserve(&events, sizeof(struct sock_event), 0);
    if (!event) {
        count_lost(KIND_SOCK_STATE);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    fill_head(&event->head, KIND_SOCK_STATE, netns);
    event->skaddr = (u64)args->skaddr;
    event->family = args->family;
    event->sport = args->sport;
    event->dport = args->dport;
    event->oldstate = args->oldstate;
    event->newstate = args->newstate;
    // (read, not copied: the verifier allows a context's fields to be loaded only at fixed offsets)
    if (args->family == SOCK_AF_INET) {
        bpf_core_read(event->saddr, 4, &args->saddr);
        bpf_core_read(event->daddr, 4, &args->daddr);
    } else {
        bpf_core_read(event->saddr, 16, &args->saddr_v6);
        bpf_core_read(event->daddr, 16, &args->daddr_v6);
    }
    event->fd = -1;
    bpf_ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}
