// Shared by every dlcsniff probe: the event head, the ring buffer, the network-namespace filter.
//
// Built once into one CO-RE object (probes.c includes every probe; sniffer/bpf_objects.py, run by `make setup`)
// that libbpf loads as it is on any kernel with BTF. The build's -D flags are the record layout shared with the
// decoders (decoders/formats/probe_events.py: EVENT_HEAD_BYTES, *_EVENT_BYTES, KIND_*, KIND_COUNT, checked
// here by _Static_assert) and RINGBUF_BYTES. What differs per run is read-only data set at load
// (sniffer/ebpf.py): the network namespace watched, the loader's addresses (probes/libs.c).
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "kernel.h"

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;

#if !defined(PT_REGS_PARM6) && defined(__TARGET_ARCH_x86)
#define PT_REGS_PARM6(x) ((x)->r9)            // x86-64 System V: the 6th integer argument (libbpf 1.1 lacks it)
#endif

const volatile u32 netns_inum = 0;       // inode of the network namespace watched (the daemon's own)

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
_Static_assert(sizeof(struct event_head) == EVENT_HEAD_BYTES, "event_head differs from probe_events.py");

// The daemon reads the ring on a timer: events are submitted with BPF_RB_NO_WAKEUP, sparing the traced
// job the cost of a wakeup per event.
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, RINGBUF_BYTES);
} events SEC(".maps");

struct {                                   // per kind: events the ring buffer had no room for
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, KIND_COUNT);
    __type(key, u32);
    __type(value, u64);
} lost SEC(".maps");

static __always_inline void count_lost(u32 kind) {
    u64 *slot = bpf_map_lookup_elem(&lost, &kind);
    if (slot)
        *slot += 1;
}

static __always_inline u32 task_netns(void) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    struct nsproxy *nsproxy = BPF_CORE_READ(task, nsproxy);
    if (!nsproxy)          // an exiting task has dropped its namespaces
        return 0;
    return BPF_CORE_READ(nsproxy, net_ns, ns.inum);
}

static __always_inline u32 sock_netns(const struct sock *sk) {
    return BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
}

static __always_inline int netns_watched(u32 netns) {
    return netns == netns_inum;
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
    // The thread's own comm would name libzmq's I/O thread ("ZMQbg/IO/0"), not the program.
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    struct task_struct *leader = BPF_CORE_READ(task, group_leader);
    bpf_core_read(&head->comm, sizeof(head->comm), &leader->comm);
}
