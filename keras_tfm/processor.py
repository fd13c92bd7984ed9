"""What a kernel's choice needs to know of the machine's processor: whether it is x86, who made it and its
instruction set extensions, from Linux's /proc/cpuinfo (elsewhere, what `platform` tells)."""

from __future__ import annotations

import functools
import os
import platform


def cpu_fields(text: str | None = None) -> dict[str, str]:
    """The first processor's fields in `text`, a /proc/cpuinfo (this machine's by default; {} without one).

    Example:

    >>> cpu_fields("vendor_id\\t: GenuineIntel\\nflags\\t\\t: fpu avx512f\\n")["vendor_id"]
    'GenuineIntel'
    """
    if text is None:
        return dict(_machine_fields())
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block ends at an empty line
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


@functools.cache
def _machine_fields() -> tuple[tuple[str, str], ...]:
    if not os.path.isfile("/proc/cpuinfo"):
        return ()
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
        return tuple(cpu_fields(file.read()).items())


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cpu_flags(fields: dict[str, str] | None = None) -> set[str]:
    """The instruction set extensions of `fields` (`cpu_fields()`'s by default), e.g. `avx512_vnni`."""
    return set((cpu_fields() if fields is None else fields).get("flags", "").split())


def made_by_intel(fields: dict[str, str] | None = None) -> bool:
    """Whether the processor of `fields` (`cpu_fields()`'s by default) is Intel's: MKL takes its fast paths on
    Intel's processors only. Without /proc/cpuinfo, `platform.processor()` names the maker (Windows)."""
    fields = cpu_fields() if fields is None else fields
    if "vendor_id" in fields:
        return fields["vendor_id"] == "GenuineIntel"
    return "GenuineIntel" in platform.processor()
