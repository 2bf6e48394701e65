"""The facts about a shared library that the build guard and the build tests
need, read from the ELF file itself (no readelf/ldd: they are not on every
machine, and ldd would run the loader): the libraries it depends on
(DT_NEEDED), the dynamic symbols it defines, and its section names (debug
information or not). 32- and 64-bit, either byte order."""
from __future__ import annotations

import mmap
import struct
from typing import List, Set

SHT_DYNAMIC, SHT_DYNSYM = 6, 11
DT_NULL, DT_NEEDED = 0, 1
SHN_UNDEF = 0


class ElfFile:
    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self.data[:4] != b"\x7fELF":
            raise ValueError(f"{path} is not an ELF file")
        self.is64 = self.data[4] == 2
        self.end = "<" if self.data[5] == 1 else ">"
        if self.is64:
            shoff, = self._unpack("Q", 0x28)
            shentsize, shnum = self._unpack("HH", 0x3A)
        else:
            shoff, = self._unpack("I", 0x20)
            shentsize, shnum = self._unpack("HH", 0x2E)
        shstrndx, = self._unpack("H", 0x3E if self.is64 else 0x32)
        self.sections = [self._section(shoff + i * shentsize) for i in range(shnum)]
        self.shstrndx = shstrndx if shstrndx < len(self.sections) else 0

    def _unpack(self, fmt: str, offset: int):
        return struct.unpack_from(self.end + fmt, self.data, offset)

    def _section(self, at: int) -> dict:
        if self.is64:
            name, typ, _, _, off, size, link, _, _, entsize = self._unpack("IIQQQQIIQQ", at)
        else:
            name, typ, _, _, off, size, link, _, _, entsize = self._unpack("IIIIIIIIII", at)
        return {"name": name, "type": typ, "offset": off, "size": size, "link": link, "entsize": entsize}

    def section_sizes(self) -> dict:
        """Section name -> bytes in the file (".debug_info", ".text", ...)."""
        if not self.shstrndx:
            return {}
        names = self.sections[self.shstrndx]
        return {self._string(names, sec["name"]): sec["size"] for sec in self.sections}

    def _string(self, strtab: dict, index: int) -> str:
        start = strtab["offset"] + index
        return self.data[start:self.data.find(b"\0", start)].decode("utf-8", "replace")

    def needed(self) -> List[str]:
        """DT_NEEDED entries, in link order."""
        out = []
        for sec in self.sections:
            if sec["type"] != SHT_DYNAMIC:
                continue
            strtab, fmt = self.sections[sec["link"]], ("qQ" if self.is64 else "iI")
            step = struct.calcsize(fmt)
            for at in range(sec["offset"], sec["offset"] + sec["size"], step):
                tag, val = self._unpack(fmt, at)
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED:
                    out.append(self._string(strtab, val))
        return out

    def defined_symbols(self) -> Set[str]:
        """Names of the symbols this library defines in its dynamic symbol table
        (what it exports to, or could interpose on, every other library)."""
        out = set()
        for sec in self.sections:
            if sec["type"] != SHT_DYNSYM or not sec["entsize"]:
                continue
            strtab = self.sections[sec["link"]]
            for at in range(sec["offset"], sec["offset"] + sec["size"], sec["entsize"]):
                if self.is64:
                    name, _, _, shndx = self._unpack("IBBH", at)
                else:
                    name, shndx = self._unpack("I8xxxH", at)
                if shndx != SHN_UNDEF and name:
                    out.add(self._string(strtab, name))
        return out

    def close(self) -> None:
        self.data.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def needed(path: str) -> List[str]:
    with ElfFile(path) as f:
        return f.needed()


def defined_symbols(path: str) -> Set[str]:
    with ElfFile(path) as f:
        return f.defined_symbols()


def section_sizes(path: str) -> dict:
    with ElfFile(path) as f:
        return f.section_sizes()
