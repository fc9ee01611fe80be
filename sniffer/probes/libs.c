// Which shared objects the watched processes load: the daemon looks for libzmq / libnccl symbols in each new
// one and attaches its uprobes there.
//
// glibc's dynamic loader calls _dl_debug_state() (r_debug.r_brk: the debuggers' hook) after each change to
// its list of loaded objects: once a program's own libraries are mapped, then at every dlopen/dlclose. One
// uprobe there, in every process that loader runs, costs a trap per change and none on the job's data path
// (a syscall tracepoint on openat() would slow every system call of every process). At RT_CONSISTENT the
// list (struct r_debug -> struct link_map chain, <link.h>) holds every object loaded: the probe reports the
// ones after the last it reported in that process.
//
// ldso_debug_state_addr, ldso_r_debug_addr (set at load): the two symbols' addresses in the loader's file (the
// daemon attaches the hook only where it found them, and says so where it did not).
struct lib_event {
    struct event_head head;
    char path[LIB_PATH_BYTES];     // the object's name in the loader's list (l_name): the path it was loaded from
};
_Static_assert(sizeof(struct lib_event) == LIB_EVENT_BYTES, "lib_event differs from probe_events.py");

#define RT_CONSISTENT 0
#define R_DEBUG_MAP_OFFSET 8       // struct r_debug { int r_version; struct link_map *r_map; ElfW(Addr) r_brk;
#define R_DEBUG_STATE_OFFSET 24    //                  enum { RT_CONSISTENT, RT_ADD, RT_DELETE } r_state; ... }
#define LINK_MAP_NAME_OFFSET 8     // struct link_map { ElfW(Addr) l_addr; char *l_name; ElfW(Dyn) *l_ld;
#define LINK_MAP_NEXT_OFFSET 24    //                   struct link_map *l_next, *l_prev; }
#define LOADED_WALK_MAX 1024       // objects a process may have loaded
#define LOADED_REPORT_MAX 64       // objects reported per change (the next change reports the rest)

const volatile u64 ldso_debug_state_addr = 0;
const volatile u64 ldso_r_debug_addr = 0;

struct {                                   // process -> link_map of the last object reported
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, u64);
} loaded_reported SEC(".maps");

static __always_inline u64 read_user_pointer(u64 address) {
    u64 value = 0;
    bpf_probe_read_user(&value, sizeof(value), (void *)address);
    return value;
}

SEC("uprobe")
int ldso_debug_state(struct pt_regs *ctx) {
    u32 netns = task_netns();
    if (!netns_watched(netns))
        return 0;
    u64 r_debug = PT_REGS_IP(ctx) - ldso_debug_state_addr + ldso_r_debug_addr;
    int state = -1;
    bpf_probe_read_user(&state, sizeof(state), (void *)(r_debug + R_DEBUG_STATE_OFFSET));
    if (state != RT_CONSISTENT)
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 *last = bpf_map_lookup_elem(&loaded_reported, &tgid);
    u64 reported = last ? *last : 0;
    u64 object = read_user_pointer(r_debug + R_DEBUG_MAP_OFFSET);
    // Past the last object reported (not found, after a dlclose: from the start; the daemon drops repeats).
    if (reported) {
        u64 from = object;
        for (int i = 0; i < LOADED_WALK_MAX && from; i++) {
            u64 next = read_user_pointer(from + LINK_MAP_NEXT_OFFSET);
            if (from == reported) {
                object = next;
                break;
            }
            from = next;
        }
    }
    for (int i = 0; i < LOADED_REPORT_MAX && object; i++) {
        u64 name = read_user_pointer(object + LINK_MAP_NAME_OFFSET);
        reported = object;
        object = read_user_pointer(object + LINK_MAP_NEXT_OFFSET);
        struct lib_event *event = bpf_ringbuf_reserve(&events, sizeof(struct lib_event), 0);
        if (!event) {
            count_lost(KIND_LIB_OPEN);
            break;
        }
        __builtin_memset(event, 0, sizeof(*event));
        long length = bpf_probe_read_user_str(event->path, sizeof(event->path), (void *)name);
        if (length <= 1) {                           // the program itself, the vDSO: no file name
            bpf_ringbuf_discard(event, BPF_RB_NO_WAKEUP);
            continue;
        }
        fill_head(&event->head, KIND_LIB_OPEN, netns);
        bpf_ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    }
    if (reported)
        bpf_map_update_elem(&loaded_reported, &tgid, &reported, BPF_ANY);
    return 0;
}
