// The one BPF program the daemon loads (one compile): every probe family, sharing one ring buffer so
// that the daemon reads their events in a single time-ordered stream.
#include "common.h"
#include "sock.c"
#include "libs.c"
#include "zmq.c"
#include "nccl.c"
