// Which shared objects the watched processes open: the daemon looks for libzmq / libnccl symbols in
// each new one and attaches its uprobes there. The dynamic loader opens libraries with openat().
struct lib_event {
    struct event_head head;
    char path[LIB_PATH_BYTES];     // as passed to openat(): may be relative to the process's cwd
};
_Static_assert(sizeof(struct lib_event) == LIB_EVENT_BYTES, "lib_event differs from sniffer/events.py");

// "*.so" or "*.so.*"
static __always_inline bool names_shared_object(const char *path, long length) {
    for (int i = 0; i < LIB_PATH_BYTES - 3; i++) {
        if (i + 3 >= length)
            break;
        if (path[i] == '.' && path[i + 1] == 's' && path[i + 2] == 'o' && (path[i + 3] == 0 || path[i + 3] == '.'))
            return true;
    }
    return false;
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat) {
    u32 netns = task_netns();
    if (!netns_watched(netns))
        return 0;
    struct lib_event *event = events.ringbuf_reserve(sizeof(struct lib_event));
    if (!event) {
        count_lost(KIND_LIB_OPEN);
        return 0;
    }
    __builtin_memset(event, 0, sizeof(*event));
    long length = bpf_probe_read_user_str(event->path, sizeof(event->path), args->filename);
    if (length <= 0 || !names_shared_object(event->path, length)) {
        events.ringbuf_discard(event, BPF_RB_NO_WAKEUP);
        return 0;
    }
    fill_head(&event->head, KIND_LIB_OPEN, netns);
    events.ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}
