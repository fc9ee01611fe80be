// The few kernel types the probes read, as CO-RE declarations: each member's place is relocated by libbpf
// against the running kernel's BTF (/sys/kernel/btf/vmlinux) when the object is loaded, so one object built
// anywhere reads any kernel's layout. Only the members named here are read; their kernel types hold more.
#pragma once

#define __core __attribute__((preserve_access_index))

struct ns_common {
    unsigned int inum;
} __core;

struct net {
    struct ns_common ns;
} __core;

struct nsproxy {
    struct net *net_ns;
} __core;

struct task_struct {
    struct nsproxy *nsproxy;
    struct task_struct *group_leader;
    char comm[16];
} __core;

typedef struct {
    struct net *net;
} __core possible_net_t;

struct sock_common {
    possible_net_t skc_net;
} __core;

struct sock {
    struct sock_common __sk_common;
} __core;

struct trace_entry {
    unsigned short type;
} __core;

// the tracepoint's record (include/trace/events/sock.h TRACE_EVENT(inet_sock_set_state))
struct trace_event_raw_inet_sock_set_state {
    struct trace_entry ent;
    const void *skaddr;
    int oldstate;
    int newstate;
    __u16 sport;
    __u16 dport;
    __u16 family;
    __u16 protocol;
    __u8 saddr[4];
    __u8 daddr[4];
    __u8 saddr_v6[16];
    __u8 daddr_v6[16];
} __core;
