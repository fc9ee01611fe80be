// libnccl API events: which collective or point-to-point call, on how many elements of which type,
// on which communicator and stream. NCCL calls only enqueue work on a CUDA stream, so the call time is
// when the job asked for the transfer, not when bytes moved; no return probe is needed.
//
// x86-64 System V: the first six integer arguments are in registers; the 7th and 8th are on the stack,
// above the return address, when the entry probe fires.
struct nccl_event {
    struct event_head head;
    u64 sendbuff;
    u64 recvbuff;
    u64 count;             // elements (ncclReduceScatter: per-rank receive count, ncclAllGather: send count)
    u64 comm;              // ncclComm_t
    u64 stream;            // cudaStream_t
    s32 datatype;          // ncclDataType_t, -1 when the call has none
    s32 op;                // ncclRedOp_t, -1 when the call has none
    s32 peer;              // root (broadcast, reduce) or peer rank (send, recv), -1 otherwise
    u16 function;          // NCCL_FN_*
    u16 reserved;
};
_Static_assert(sizeof(struct nccl_event) == NCCL_EVENT_BYTES, "nccl_event differs from probe_events.py");

// ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank): the 128-byte id is passed
// in memory, so `rank` is the third register argument. The communicator exists once the call returns.
struct nccl_comm_event {
    struct event_head head;
    u64 comm;
    s32 nranks;
    s32 rank;
    s32 result;            // ncclResult_t
    u32 reserved;
};
_Static_assert(sizeof(struct nccl_comm_event) == NCCL_COMM_EVENT_BYTES, "nccl_comm_event differs from probe_events.py");

struct nccl_init_call {
    u64 comm_out;
    s32 nranks;
    s32 rank;
    u32 netns;
};

struct {                                   // thread -> ncclCommInitRank call in progress
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u64);
    __type(value, struct nccl_init_call);
} nccl_init_calls SEC(".maps");

static __always_inline u64 stack_arg(struct pt_regs *ctx, int index) {
    u64 value = 0;
    bpf_probe_read_user(&value, sizeof(value), (void *)(PT_REGS_SP(ctx) + 8 * (index - 6)));
    return value;
}

static __always_inline int nccl_call(u16 function, u64 sendbuff, u64 recvbuff, u64 count, s32 datatype,
                                     s32 op, s32 peer, u64 comm, u64 stream) {
    u32 netns = task_netns();
    if (!netns_watched(netns))
        return 0;
    struct nccl_event *event = bpf_ringbuf_reserve(&events, sizeof(struct nccl_event), 0);
    if (!event) {
        count_lost(KIND_NCCL_CALL);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    fill_head(&event->head, KIND_NCCL_CALL, netns);
    event->sendbuff = sendbuff;
    event->recvbuff = recvbuff;
    event->count = count;
    event->comm = comm;
    event->stream = stream;
    event->datatype = datatype;
    event->op = op;
    event->peer = peer;
    event->function = function;
    bpf_ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}

// (sendbuff, recvbuff, count, datatype, op, comm, stream)
SEC("uprobe")
int nccl_allreduce(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_ALLREDUCE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                     PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), -1, PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}

// (sendbuff, recvbuff, recvcount, datatype, op, comm, stream)
SEC("uprobe")
int nccl_reducescatter(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_REDUCESCATTER, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                     PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), -1, PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}

// (sendbuff, recvbuff, count, datatype, root, comm, stream)
SEC("uprobe")
int nccl_broadcast(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_BROADCAST, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                     PT_REGS_PARM4(ctx), -1, PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}

// (sendbuff, recvbuff, count, datatype, op, root, comm, stream)
SEC("uprobe")
int nccl_reduce(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_REDUCE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                     PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), stack_arg(ctx, 7),
                     stack_arg(ctx, 8));
}

// (sendbuff, recvbuff, sendcount, datatype, comm, stream)
SEC("uprobe")
int nccl_allgather(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_ALLGATHER, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                     PT_REGS_PARM4(ctx), -1, -1, PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

// ncclBcast(buff, count, datatype, root, comm, stream): in place
SEC("uprobe")
int nccl_bcast(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_BCAST, PT_REGS_PARM1(ctx), PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
                     PT_REGS_PARM3(ctx), -1, PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

// ncclSend(sendbuff, count, datatype, peer, comm, stream)
SEC("uprobe")
int nccl_send(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_SEND, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), -1,
                     PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

// ncclRecv(recvbuff, count, datatype, peer, comm, stream)
SEC("uprobe")
int nccl_recv(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_RECV, 0, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), -1,
                     PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

// ncclGroupStart() / ncclGroupEnd(): the calls between them form one fused operation
SEC("uprobe")
int nccl_groupstart(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_GROUPSTART, 0, 0, 0, -1, -1, -1, 0, 0);
}

SEC("uprobe")
int nccl_groupend(struct pt_regs *ctx) {
    return nccl_call(NCCL_FN_GROUPEND, 0, 0, 0, -1, -1, -1, 0, 0);
}

// ncclCommInitRank(comm *, nranks, commId, rank) and ncclCommInitRankConfig(comm *, nranks, commId, rank, config)
SEC("uprobe")
int nccl_comm_init_enter(struct pt_regs *ctx) {
    u32 netns = task_netns();
    if (!netns_watched(netns))
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct nccl_init_call call = {.comm_out = PT_REGS_PARM1(ctx), .nranks = PT_REGS_PARM2(ctx),
                                  .rank = PT_REGS_PARM3(ctx), .netns = netns};
    bpf_map_update_elem(&nccl_init_calls, &pid_tgid, &call, BPF_ANY);
    return 0;
}

SEC("uprobe")
int nccl_comm_init_return(struct pt_regs *ctx) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct nccl_init_call *found = bpf_map_lookup_elem(&nccl_init_calls, &pid_tgid);
    if (!found)
        return 0;
    struct nccl_init_call call = *found;
    bpf_map_delete_elem(&nccl_init_calls, &pid_tgid);
    struct nccl_comm_event *event = bpf_ringbuf_reserve(&events, sizeof(struct nccl_comm_event), 0);
    if (!event) {
        count_lost(KIND_NCCL_COMM_INIT);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    fill_head(&event->head, KIND_NCCL_COMM_INIT, call.netns);
    bpf_probe_read_user(&event->comm, sizeof(event->comm), (void *)call.comm_out);
    event->nranks = call.nranks;
    event->rank = call.rank;
    event->result = (int)PT_REGS_RC(ctx);
    bpf_ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}
