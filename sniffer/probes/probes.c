// The probes' one object: one ring buffer, one time-ordered stream of events for the daemon. Each probe is
// a file of its own; they are one translation unit so that they share the maps of common.h.
#include "common.h"
#include "sock.c"
#include "libs.c"
#include "zmq.c"
#include "nccl.c"

char LICENSE[] SEC("license") = "Dual BSD/GPL";     // GPL-compatible: bpf_probe_read_kernel
