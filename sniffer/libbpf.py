"""What the capture side takes from libbpf (libbpf.so.1, through ctypes) and from the bpf() system call: per-CPU
counters, a map's size, object files loaded with their read-only settings (the probes, the snap filter), and
uprobes attached with BPF links.

Uprobes are attached as BPF_TRACE_UPROBE_MULTI links: the kernel asks for no capability there, only a program
descriptor (loaded, with its expected attach type, by the root helper), so the daemon attaches the probes
of libraries that jobs load while it runs after giving up every privilege. (The older way, a perf event of the
uprobe PMU, wanted CAP_SYS_ADMIN when tried on this machine's kernel, 6.18: CAP_PERFMON and CAP_BPF were refused.)
"""
from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Mapping, Sequence

from dlcsniff.sniffer.elf_symbols import section_variables

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48           # enum bpf_attach_type
BPF_F_UPROBE_MULTI_RETURN = 1
# union bpf_attr, link_create: prog_fd, target_fd, attach_type, flags, then uprobe_multi: path, offsets,
# ref_ctr_offsets, cookies (pointers), cnt, flags, pid
_LINK_CREATE = struct.Struct("<IIII QQQQ III")
_BPF_ATTR_BYTES = 160
_MAP_INFO_BYTES = 96                  # struct bpf_map_info (type, id, key_size, value_size, max_entries, ...)
_MAP_INFO_MAX_ENTRIES = struct.Struct("<I")
_MAP_INFO_MAX_ENTRIES_OFFSET = 16


class BpfError(RuntimeError):
    """libbpf or the bpf() call failed: what, and the kernel's reason."""


def load_libbpf() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError as exc:
        raise BpfError(f"libbpf is missing ({exc}): install libbpf1") from None
    lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    lib.bpf_object__open_mem.restype = ctypes.c_void_p
    lib.bpf_object__open_mem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.bpf_object__load.argtypes = [ctypes.c_void_p]
    lib.bpf_object__close.argtypes = [ctypes.c_void_p]
    lib.bpf_object__next_program.restype = ctypes.c_void_p
    lib.bpf_object__next_program.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_program__name.restype = ctypes.c_char_p
    lib.bpf_program__name.argtypes = [ctypes.c_void_p]
    lib.bpf_program__set_autoload.argtypes = [ctypes.c_void_p, ctypes.c_bool]
    lib.bpf_program__set_expected_attach_type.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.bpf_program__fd.argtypes = [ctypes.c_void_p]
    lib.bpf_object__find_map_fd_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_object__find_map_by_name.restype = ctypes.c_void_p
    lib.bpf_object__find_map_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_map__initial_value.restype = ctypes.c_void_p
    lib.bpf_map__initial_value.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.libbpf_set_print.restype = ctypes.c_void_p
    lib.libbpf_set_print.argtypes = [ctypes.c_void_p]
    return lib


def percpu_total(lib: ctypes.CDLL, map_fd: int, index: int) -> int:
    """The sum over CPUs of a u64 per-CPU array slot (0 when the lookup fails)."""
    values = (ctypes.c_uint64 * lib.libbpf_num_possible_cpus())()
    key = ctypes.c_uint32(index)
    return sum(values) if lib.bpf_map_lookup_elem(map_fd, ctypes.byref(key), values) == 0 else 0


def map_max_entries(lib: ctypes.CDLL, map_fd: int) -> int:
    """A map's max_entries (a ring buffer's: its size in bytes)."""
    info = ctypes.create_string_buffer(_MAP_INFO_BYTES)
    length = ctypes.c_uint32(_MAP_INFO_BYTES)
    if lib.bpf_obj_get_info_by_fd(map_fd, info, ctypes.byref(length)) != 0:
        raise BpfError(f"bpf_obj_get_info_by_fd: {os.strerror(ctypes.get_errno())}")
    return _MAP_INFO_MAX_ENTRIES.unpack_from(info.raw, _MAP_INFO_MAX_ENTRIES_OFFSET)[0]


class _OpenOptions(ctypes.Structure):
    """libbpf's struct bpf_object_open_opts (libbpf.h, 1.x): only the verifier's log buffer is set."""
    _fields_ = [("sz", ctypes.c_size_t), ("object_name", ctypes.c_char_p), ("relaxed_maps", ctypes.c_bool),
                ("pin_root_path", ctypes.c_char_p), ("_removed", ctypes.c_uint32), ("kconfig", ctypes.c_char_p),
                ("btf_custom_path", ctypes.c_char_p), ("kernel_log_buf", ctypes.c_void_p),
                ("kernel_log_size", ctypes.c_size_t), ("kernel_log_level", ctypes.c_uint32)]


VERIFIER_LOG_BYTES = 1 << 20          # the kernel keeps the end of a longer log: where the verifier stopped
VERIFIER_LOG_TAIL_LINES = 8


def load_object(elf: bytes, programs: Sequence[str], maps: Sequence[str], *, settings: Mapping[str, bytes] = {},
                attach_types: Mapping[str, int] = {}) -> tuple[dict[str, int], dict[str, int]]:
    """Load a BPF object file (root): descriptors of some of its programs (the others are not loaded) and of
    some of its maps, ours to close. `settings`: the bytes of read-only variables (`const volatile` globals
    in .rodata), set before the load, so that the verifier knows them; `attach_types`: the expected attach
    type of programs that need one. A refusal raises BpfError with the end of the verifier's log."""
    lib = load_libbpf()
    image = ctypes.create_string_buffer(elf, len(elf))
    log = ctypes.create_string_buffer(VERIFIER_LOG_BYTES)
    options = _OpenOptions(sz=ctypes.sizeof(_OpenOptions), kernel_log_buf=ctypes.cast(log, ctypes.c_void_p),
                           kernel_log_size=len(log))
    lib.libbpf_set_print(None)            # libbpf would print to the daemon's stderr; the log says why
    obj = lib.bpf_object__open_mem(image, len(elf), ctypes.byref(options))
    if not obj:
        raise BpfError(f"libbpf cannot read the object: {os.strerror(ctypes.get_errno())}")
    try:
        _set_read_only_data(lib, obj, elf, settings)
        found = {}
        program = None
        while program := lib.bpf_object__next_program(obj, program):
            name = lib.bpf_program__name(program).decode()
            lib.bpf_program__set_autoload(program, name in programs)
            if name in attach_types:
                lib.bpf_program__set_expected_attach_type(program, attach_types[name])
            found[name] = program
        if missing := [name for name in programs if name not in found]:
            raise BpfError(f"the object lacks the programs {missing}")
        if lib.bpf_object__load(obj) != 0:
            tail = "\n".join(log.value.decode(errors="replace").strip().splitlines()[-VERIFIER_LOG_TAIL_LINES:])
            raise BpfError(f"the kernel refused it: {os.strerror(ctypes.get_errno())}\n{tail}")
        map_fds = {name: lib.bpf_object__find_map_fd_by_name(obj, name.encode()) for name in maps}
        if missing := [name for name, fd in map_fds.items() if fd < 0]:
            raise BpfError(f"the object lacks the maps {missing}")
        # Descriptors of our own: closing the object closes libbpf's.
        return ({name: os.dup(lib.bpf_program__fd(found[name])) for name in programs},
                {name: os.dup(fd) for name, fd in map_fds.items()})
    finally:
        lib.bpf_object__close(obj)


def _set_read_only_data(lib: ctypes.CDLL, obj: int, elf: bytes, settings: Mapping[str, bytes]) -> None:
    if not settings:
        return
    variables = section_variables(elf, ".rodata")
    rodata = lib.bpf_object__find_map_by_name(obj, b".rodata")
    size = ctypes.c_size_t()
    data = lib.bpf_map__initial_value(rodata, ctypes.byref(size)) if rodata else None
    for name, value in settings.items():
        offset, length = variables.get(name, (0, -1))
        if not data or length != len(value) or offset + length > size.value:
            raise BpfError(f"the object has no {len(value)}-byte read-only variable {name}")
        ctypes.memmove(data + offset, value, length)


def attach_uprobes(program_fd: int, path: str, offsets: Sequence[int], *, pid: int = 0,
                   returns: bool = False) -> int:
    """Attach a program (loaded for BPF_TRACE_UPROBE_MULTI) at these file offsets of `path`, in process `pid`
    only (0: in every process mapping the file), at function entry or (`returns`) at return. Returns the
    link's descriptor: closing it detaches."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    where = (ctypes.c_uint64 * len(offsets))(*offsets)
    attr = ctypes.create_string_buffer(_BPF_ATTR_BYTES)
    _LINK_CREATE.pack_into(attr, 0, program_fd, 0, BPF_TRACE_UPROBE_MULTI, 0, ctypes.addressof(name),
                           ctypes.addressof(where), 0, 0, len(offsets), BPF_F_UPROBE_MULTI_RETURN if returns else 0,
                           pid)
    libc = ctypes.CDLL(None, use_errno=True)
    number = _SYS_BPF.get(os.uname().machine)
    if number is None:
        raise BpfError(f"bpf() system call number unknown on {os.uname().machine}")
    fd = libc.syscall(number, BPF_LINK_CREATE, attr, _BPF_ATTR_BYTES)
    if fd < 0:
        raise BpfError(f"uprobe link on {path}: {os.strerror(ctypes.get_errno())}")
    return fd
