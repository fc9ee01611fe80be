// Shared by every dlcsniff probe: the event head, the ring buffer, the network-namespace filter.
//
// Compiled by bcc with -D flags from sniffer/ebpf.py (never by editing this text):
//   EVENT_HEAD_BYTES, *_EVENT_BYTES  layout sizes from sniffer/events.py (checked by _Static_assert)
//   KIND_*, KIND_COUNT               event kinds from sniffer/events.py
//   RINGBUF_PAGES                    ring buffer size in pages
//   NETNS_INUM                       inode of the network namespace to watch (absent: watch every one)
//   TASK_NSPROXY_OFFSET, NSPROXY_NET_NS_OFFSET, NET_NS_INUM_OFFSET, SOCK_NET_OFFSET,
//   TASK_GROUP_LEADER_OFFSET, TASK_COMM_OFFSET
//                                    member offsets read from the running kernel's BTF: the installed
//                                    headers may belong to another kernel version, the BTF never does.
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>

struct event_head {
    u16 kind;
    u16 reserved;
    u32 tgid;              // process id (thread group)
    u32 tid;               // thread id
    u32 netns;             // network namespace inode (0: unknown)
    u64 ts_ns;             // bpf_ktime_get_ns(): CLOCK_MONOTONIC
    u64 cgroup_id;         // cgroup v2 id of the task
    char comm[16];         // the process's (thread group leader's) name
};
_Static_assert(sizeof(struct event_head) == EVENT_HEAD_BYTES, "event_head differs from sniffer/events.py");

// The daemon reads the ring on a timer: events are submitted with BPF_RB_NO_WAKEUP, sparing the traced
// job the cost of a wakeup per event.
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
BPF_PERCPU_ARRAY(lost, u64, KIND_COUNT);    // per kind: events the ring buffer had no room for

static __always_inline void count_lost(u32 kind) {
    u64 *slot = lost.lookup(&kind);
    if (slot)
        *slot += 1;
}

static __always_inline u32 netns_of_net(void *net) {
    u32 inum = 0;
#ifdef NET_NS_INUM_OFFSET
    bpf_probe_read_kernel(&inum, sizeof(inum), (char *)net + NET_NS_INUM_OFFSET);
#endif
    return inum;
}

static __always_inline u32 task_netns(void) {
#ifdef TASK_NSPROXY_OFFSET
    char *task = (char *)bpf_get_current_task();
    void *nsproxy = NULL;
    void *net = NULL;
    bpf_probe_read_kernel(&nsproxy, sizeof(nsproxy), task + TASK_NSPROXY_OFFSET);
    if (!nsproxy)      // an exiting task has dropped its namespaces
        return 0;
    bpf_probe_read_kernel(&net, sizeof(net), (char *)nsproxy + NSPROXY_NET_NS_OFFSET);
    return netns_of_net(net);
#else
    return 0;
#endif
}

static __always_inline u32 sock_netns(const void *sk) {
#ifdef SOCK_NET_OFFSET
    void *net = NULL;
    bpf_probe_read_kernel(&net, sizeof(net), (const char *)sk + SOCK_NET_OFFSET);
    return netns_of_net(net);
#else
    return 0;
#endif
}

static __always_inline bool netns_watched(u32 netns) {
#ifdef NETNS_INUM
    return netns == NETNS_INUM;
#else
    return true;
#endif
}

// The head of an event about the current task. `netns` is passed in: the caller already read it.
static __always_inline void fill_head(struct event_head *head, u16 kind, u32 netns) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    head->kind = kind;
    head->reserved = 0;
    head->tgid = pid_tgid >> 32;
    head->tid = (u32)pid_tgid;
    head->netns = netns;
    head->ts_ns = bpf_ktime_get_ns();
    head->cgroup_id = bpf_get_current_cgroup_id();
#ifdef TASK_GROUP_LEADER_OFFSET
    // The thread's own comm would name libzmq's I/O thread ("ZMQbg/IO/0"), not the program.
    char *task = (char *)bpf_get_current_task();
    char *leader = NULL;
    bpf_probe_read_kernel(&leader, sizeof(leader), task + TASK_GROUP_LEADER_OFFSET);
    bpf_probe_read_kernel(&head->comm, sizeof(head->comm), leader + TASK_COMM_OFFSET);
#else
    bpf_get_current_comm(&head->comm, sizeof(head->comm));
#endif
}
