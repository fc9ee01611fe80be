"""Symbols of ELF files, read without any library: which functions a shared object defines and where they lie in
it (a uprobe is attached at a file offset), where the dynamic loader keeps its list of loaded objects, and where
a BPF object's read-only settings lie in its .rodata (set before it is loaded)."""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_ELF_PROGRAM = struct.Struct("<IIQQQQQQ")
_ELF_SECTION = struct.Struct("<IIQQQQIIQQ")
_ELF_SYMBOL = struct.Struct("<IBBHQQ")
_PT_LOAD, _PT_INTERP = 1, 3
_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_STT_OBJECT, _STT_FUNC, _STT_GNU_IFUNC = 1, 2, 10
PROBED_SYMBOL_PREFIXES = (b"zmq_", b"nccl")
# glibc's loader calls _dl_debug_state (r_debug.r_brk, the debuggers' hook) after each change to its list
# of loaded objects, whose head is in _r_debug (<link.h>).
LOADER_SYMBOLS = (b"_dl_debug_state", b"_r_debug")


@dataclass(frozen=True, slots=True)
class Symbol:
    address: int          # st_value: the address in the file's own layout (added to its load base)
    file_offset: int      # where its bytes are in the file (-1: in no segment's file bytes, e.g. .bss)


def elf_symbols(path: str, prefixes: tuple[bytes, ...] = PROBED_SYMBOL_PREFIXES, *,
                objects: bool = False) -> dict[str, Symbol]:
    """The functions (and with `objects`, data objects) a 64-bit little-endian ELF file defines (.dynsym and
    .symtab) whose names start with one of `prefixes`; empty for anything else. Most shared objects a job
    loads are ruled out by one search of their string tables, without reading their symbols."""
    try:
        with open(path, "rb") as file:
            return _elf_symbols(file, prefixes, objects)
    except (OSError, ValueError, struct.error):
        return {}


def _read_at(file, offset: int, size: int) -> bytes:
    file.seek(offset)
    data = file.read(size)
    if len(data) != size:
        raise ValueError("ELF file shorter than its headers say")
    return data


def _header(file) -> tuple | None:
    fields = _ELF_HEADER.unpack(_read_at(file, 0, _ELF_HEADER.size))
    ident = fields[0]
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return None
    return fields


def _segments(file, header: tuple) -> list[tuple]:
    _, _, _, _, _, program_offset, _, _, _, program_size, program_count, _, _, _ = header
    if program_size != _ELF_PROGRAM.size:
        return []
    return list(_ELF_PROGRAM.iter_unpack(_read_at(file, program_offset, program_count * program_size)))


def _file_offset(segments: list[tuple], address: int) -> int:
    for kind, _, offset, vaddr, _, file_size, _, _ in segments:
        if kind == _PT_LOAD and vaddr <= address < vaddr + file_size:
            return address - vaddr + offset
    return -1


def _elf_symbols(file, prefixes: tuple[bytes, ...], objects: bool) -> dict[str, Symbol]:
    header = _header(file)
    if header is None:
        return {}
    *_, section_offset, _, _, _, _, section_size, section_count, _ = header
    if section_size != _ELF_SECTION.size:
        return {}
    sections = list(_ELF_SECTION.iter_unpack(_read_at(file, section_offset, section_count * section_size)))
    kinds = (_STT_FUNC, _STT_GNU_IFUNC, _STT_OBJECT) if objects else (_STT_FUNC, _STT_GNU_IFUNC)
    segments = None
    found = {}
    for _, kind, _, _, offset, size, link, _, _, entry_size in sections:
        if kind not in (_SHT_SYMTAB, _SHT_DYNSYM) or entry_size != _ELF_SYMBOL.size or link >= len(sections):
            continue
        strings = _read_at(file, sections[link][4], sections[link][5])
        if not any(b"\0" + prefix in strings for prefix in prefixes):
            continue
        segments = segments if segments is not None else _segments(file, header)
        for name_offset, info, _, section_index, value, _ in _ELF_SYMBOL.iter_unpack(_read_at(file, offset, size)):
            if section_index and info & 0xF in kinds and strings.startswith(prefixes, name_offset):
                name = strings[name_offset:strings.index(b"\0", name_offset)].decode()
                found.setdefault(name, Symbol(value, _file_offset(segments, value)))
    return found


def section_variables(image: bytes, section: str) -> dict[str, tuple[int, int]]:
    """The data objects a relocatable ELF file (a compiled BPF object) defines in `section`: name -> (offset in
    the section, size). Empty for anything else."""
    file = io.BytesIO(image)
    try:
        header = _header(file)
        if header is None:
            return {}
        *_, section_offset, _, _, _, _, section_size, section_count, names_index = header
        sections = list(_ELF_SECTION.iter_unpack(_read_at(file, section_offset, section_count * section_size)))
        names = _read_at(file, sections[names_index][4], sections[names_index][5])
        wanted = [index for index, (name, *_) in enumerate(sections)
                  if names[name:names.index(b"\0", name)] == section.encode()]
        found = {}
        for _, kind, _, _, offset, size, link, _, _, entry_size in sections:
            if kind != _SHT_SYMTAB or entry_size != _ELF_SYMBOL.size:
                continue
            strings = _read_at(file, sections[link][4], sections[link][5])
            for name_offset, info, _, section_index, value, symbol_size in _ELF_SYMBOL.iter_unpack(
                    _read_at(file, offset, size)):
                if section_index in wanted and info & 0xF == _STT_OBJECT:
                    found[strings[name_offset:strings.index(b"\0", name_offset)].decode()] = (value, symbol_size)
        return found
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        return {}


def interpreter(path: str) -> str | None:
    """The dynamic loader an executable names (PT_INTERP), or None."""
    try:
        with open(path, "rb") as file:
            header = _header(file)
            if header is None:
                return None
            for kind, _, offset, _, _, file_size, _, _ in _segments(file, header):
                if kind == _PT_INTERP:
                    return _read_at(file, offset, file_size).rstrip(b"\0").decode()
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None
    return None
