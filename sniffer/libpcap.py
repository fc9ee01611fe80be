"""libpcap driven in-process through ctypes: a live capture handle and the pcap files it writes (with
libpcap's own pcap_dump: no Python per packet)."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from dlcsniff.sniffer.options import EXIT_BAD_OPTIONS, EXIT_FAILED, MAX_SNAPLEN, DaemonError, bad_option, write_error

PCAP_TIMEOUT_MS = 100              # TPACKET_V3 block timeout: packets wait in the kernel at most this long
STDIO_BUFFER_BYTES = 1 << 20
PCAP_FILE_HEADER_BYTES = 24
PCAP_RECORD_HEADER_BYTES = 16


class _PcapStat(ctypes.Structure):
    _fields_ = [("ps_recv", ctypes.c_uint), ("ps_drop", ctypes.c_uint), ("ps_ifdrop", ctypes.c_uint)]


class _BpfProgram(ctypes.Structure):
    _fields_ = [("bf_len", ctypes.c_uint), ("bf_insns", ctypes.c_void_p)]


_PCAP_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_PCAP_ERRBUF_BYTES = 256
_PCAP_NETMASK_UNKNOWN = 0xFFFFFFFF
_PCAP_TSTAMP_PRECISION_NANO = 1
_IOFBF = 0
# libpcap's sonames: Debian's (libpcap0.8), upstream's. Loaded by name, as libbpf.so.1 is: ctypes.util.find_library
# would run ldconfig (a process) at every start.
LIBPCAP_NAMES = ("libpcap.so.0.8", "libpcap.so.1")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.fdopen.restype = ctypes.c_void_p
_libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
_libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t]


def _load_libpcap() -> ctypes.CDLL:
    for name in LIBPCAP_NAMES:
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            break
        except OSError:
            continue
    else:
        raise DaemonError(f"libpcap is not installed (none of {', '.join(LIBPCAP_NAMES)}; apt-get install libpcap0.8)")
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    signatures = {
        "pcap_create": (p, [s, s]), "pcap_set_snaplen": (i, [p, i]), "pcap_set_promisc": (i, [p, i]),
        "pcap_set_timeout": (i, [p, i]), "pcap_set_buffer_size": (i, [p, i]),
        "pcap_set_tstamp_precision": (i, [p, i]), "pcap_activate": (i, [p]), "pcap_geterr": (s, [p]),
        "pcap_statustostr": (s, [i]), "pcap_compile": (i, [p, ctypes.POINTER(_BpfProgram), s, i, ctypes.c_uint32]),
        "pcap_setfilter": (i, [p, ctypes.POINTER(_BpfProgram)]), "pcap_freecode": (None, [ctypes.POINTER(_BpfProgram)]),
        "pcap_setnonblock": (i, [p, i, s]), "pcap_get_selectable_fd": (i, [p]),
        "pcap_dispatch": (i, [p, i, _PCAP_HANDLER, p]), "pcap_dump_fopen": (p, [p, p]),
        "pcap_dump_flush": (i, [p]), "pcap_dump_ftell64": (ctypes.c_int64, [p]), "pcap_dump_close": (None, [p]),
        "pcap_stats": (i, [p, ctypes.POINTER(_PcapStat)]), "pcap_close": (None, [p]), "pcap_datalink": (i, [p]),
        "pcap_lib_version": (s, []),
    }
    for function, (restype, argtypes) in signatures.items():
        getattr(lib, function).restype = restype
        getattr(lib, function).argtypes = argtypes
    return lib


class LivePcap:
    """An activated libpcap handle on an interface, filter set, non-blocking."""

    def __init__(self, interface: str, *, snaplen: int, buffer_bytes: int, filter_text: str | None) -> None:
        self._lib = _load_libpcap()
        errbuf = ctypes.create_string_buffer(_PCAP_ERRBUF_BYTES)
        self._handle = self._lib.pcap_create(interface.encode(), errbuf)
        if not self._handle:
            raise bad_option(f"--iface {interface}: {errbuf.value.decode(errors='replace')}")
        lib, handle = self._lib, self._handle
        try:
            lib.pcap_set_snaplen(handle, snaplen or MAX_SNAPLEN)
            lib.pcap_set_promisc(handle, 0)
            lib.pcap_set_timeout(handle, PCAP_TIMEOUT_MS)
            lib.pcap_set_buffer_size(handle, buffer_bytes)
            lib.pcap_set_tstamp_precision(handle, _PCAP_TSTAMP_PRECISION_NANO)
            status = lib.pcap_activate(handle)
            if status < 0:
                detail = lib.pcap_geterr(handle).decode(errors="replace") or lib.pcap_statustostr(status).decode()
                raise DaemonError(f"cannot capture on {interface}: {detail}",
                                   EXIT_BAD_OPTIONS if os.geteuid() == 0 else EXIT_FAILED)
            if filter_text:
                program = _BpfProgram()
                if lib.pcap_compile(handle, ctypes.byref(program), filter_text.encode(), 1, _PCAP_NETMASK_UNKNOWN) != 0:
                    raise bad_option(f"bad filter {filter_text!r}: {lib.pcap_geterr(handle).decode(errors='replace')}")
                try:
                    if lib.pcap_setfilter(handle, ctypes.byref(program)) != 0:
                        raise DaemonError(f"cannot set the filter: {lib.pcap_geterr(handle).decode(errors='replace')}")
                finally:
                    lib.pcap_freecode(ctypes.byref(program))
            if lib.pcap_setnonblock(handle, 1, errbuf) != 0:
                raise DaemonError(f"cannot make the capture non-blocking: {errbuf.value.decode(errors='replace')}")
        except BaseException:
            lib.pcap_close(handle)
            raise
        self.max_record_bytes = PCAP_RECORD_HEADER_BYTES + (snaplen or MAX_SNAPLEN)
        self.linktype = lib.pcap_datalink(handle)
        self.fd = lib.pcap_get_selectable_fd(handle)
        self.version = lib.pcap_lib_version().decode()
        # pcap_dump itself is the per-packet callback: packets go from the kernel ring to the file in C.
        self._dump = _PCAP_HANDLER(ctypes.cast(lib.pcap_dump, ctypes.c_void_p).value)

    def open_file(self, path: Path, fd: int) -> PcapFile:
        """A pcap file of this capture on `fd`, a new file opened for writing at `path`."""
        return PcapFile(self._lib, self._handle, path, fd)

    def dispatch(self, file: PcapFile, max_packets: int) -> int:
        """Write up to max_packets waiting packets to `file`; returns how many."""
        count = self._lib.pcap_dispatch(self._handle, max_packets, self._dump, file.dumper)
        if count < 0:
            raise DaemonError(f"capture failed: {self._lib.pcap_geterr(self._handle).decode(errors='replace')}")
        return count

    def dropped(self) -> int:
        """Packets the kernel dropped since the capture opened (ring full)."""
        stats = _PcapStat()
        if self._lib.pcap_stats(self._handle, ctypes.byref(stats)) != 0:
            raise DaemonError(f"pcap_stats: {self._lib.pcap_geterr(self._handle).decode(errors='replace')}")
        return stats.ps_drop

    def close(self) -> None:
        if self._handle:
            self._lib.pcap_close(self._handle)
            self._handle = None


class PcapFile:
    """One pcap file being written (created 0600, never overwriting)."""

    def __init__(self, lib: ctypes.CDLL, handle: int, path: Path, fd: int) -> None:
        self._lib = lib
        self.name = path.name
        self.path = path
        stream = _libc.fdopen(fd, b"wb")
        if not stream:
            os.close(fd)
            raise DaemonError(f"{self.path}: fdopen failed: {os.strerror(ctypes.get_errno())}")
        _libc.setvbuf(stream, None, _IOFBF, STDIO_BUFFER_BYTES)
        self.dumper = lib.pcap_dump_fopen(handle, stream)
        if not self.dumper:
            raise DaemonError(f"{self.path}: {lib.pcap_geterr(handle).decode(errors='replace')}")
        self.packets = 0
        self.flush()

    def size(self) -> int:
        return self._lib.pcap_dump_ftell64(self.dumper)

    def flush(self) -> None:
        if self._lib.pcap_dump_flush(self.dumper) != 0:
            raise write_error(self.path, ctypes.get_errno())

    def close(self) -> None:
        if self.dumper:
            self.flush()
            self._lib.pcap_dump_close(self.dumper)
            self.dumper = None
