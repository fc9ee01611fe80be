// Flow -> process attribution from tracepoints only (this kernel kind has no kprobes), none of them on
// the data path: a job's send() and recv() calls run no probe.
//
// - sock:inet_sock_set_state gives every TCP state change with the socket address and its 4-tuple.
//   The CLOSE -> SYN_SENT change runs inside connect(), and CLOSE -> LISTEN inside listen(), so their
//   task is the connecting / listening process; the other changes often run in softirq context, where
//   the current task is whoever was interrupted.
// - accept()/accept4() exit: the accepting process and the peer address it was given.
//
// (sock:sock_send_length / sock_recv_length would name the process doing I/O on each socket, but they run
// on every send and recv of every process. On the MXNet job of tests/test_daemon_mxnet.py, dropping them
// and attaching uprobes per process took the probes' share of the job's own CPU from +21 % to +4 %.)
#include <net/sock.h>
#include <linux/socket.h>
#include <linux/in.h>
#include <linux/in6.h>

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
_Static_assert(sizeof(struct sock_event) == SOCK_EVENT_BYTES, "sock_event differs from sniffer/events.py");

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != IPPROTO_TCP)
        return 0;
    u32 netns = sock_netns(args->skaddr);
    if (!netns_watched(netns))
        return 0;
    struct sock_event *event = events.ringbuf_reserve(sizeof(struct sock_event));
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
    if (args->family == AF_INET) {
        __builtin_memcpy(event->saddr, args->saddr, 4);
        __builtin_memcpy(event->daddr, args->daddr, 4);
    } else {
        __builtin_memcpy(event->saddr, args->saddr_v6, 16);
        __builtin_memcpy(event->daddr, args->daddr_v6, 16);
    }
    event->fd = -1;
    events.ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}

struct accept_call {
    u64 peer_sockaddr;     // user pointer handed to accept(), may be NULL
};
BPF_HASH(accept_calls, u64, struct accept_call, 4096);     // thread -> accept() in progress

static __always_inline int on_accept_enter(const void *peer_sockaddr) {
    if (!netns_watched(task_netns()))
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct accept_call call = {.peer_sockaddr = (u64)peer_sockaddr};
    accept_calls.update(&pid_tgid, &call);
    return 0;
}

static __always_inline int on_accept_exit(long fd) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct accept_call *call = accept_calls.lookup(&pid_tgid);
    if (!call)
        return 0;
    u64 peer = call->peer_sockaddr;
    accept_calls.delete(&pid_tgid);
    if (fd < 0 || !peer)
        return 0;
    u32 netns = task_netns();
    u16 family = 0;
    bpf_probe_read_user(&family, sizeof(family), (void *)peer);
    if (family != AF_INET && family != AF_INET6)
        return 0;
    struct sock_event *event = events.ringbuf_reserve(sizeof(struct sock_event));
    if (!event) {
        count_lost(KIND_SOCK_ACCEPT);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    fill_head(&event->head, KIND_SOCK_ACCEPT, netns);
    event->family = family;
    u16 port_be = 0;
    if (family == AF_INET) {
        struct sockaddr_in *in4 = (struct sockaddr_in *)peer;
        bpf_probe_read_user(&port_be, sizeof(port_be), &in4->sin_port);
        bpf_probe_read_user(event->daddr, 4, &in4->sin_addr);
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)peer;
        bpf_probe_read_user(&port_be, sizeof(port_be), &in6->sin6_port);
        bpf_probe_read_user(event->daddr, 16, &in6->sin6_addr);
    }
    event->dport = ntohs(port_be);
    event->fd = fd;
    events.ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_accept) {
    return on_accept_enter(args->upeer_sockaddr);
}

TRACEPOINT_PROBE(syscalls, sys_enter_accept4) {
    return on_accept_enter(args->upeer_sockaddr);
}

TRACEPOINT_PROBE(syscalls, sys_exit_accept) {
    return on_accept_exit(args->ret);
}

TRACEPOINT_PROBE(syscalls, sys_exit_accept4) {
    return on_accept_exit(args->ret);
}
