"""Transparent huge pages for XLA:CPU's per-call buffers (the CLI turns them on).

XLA:CPU allocates each call's temporaries (350 MB for the small model's update step at
8 x 8 x 64) with `malloc`, which glibc serves above 32 MB with a fresh `mmap` and returns with
`munmap`: every call then touches new memory, one minor page fault per 4 KiB page (85 000 per
update step, 0.13 s of kernel time, 15-20 % of the step). On Linux with transparent huge pages
in `madvise` mode (the common default), glibc >= 2.35 asks for 2 MiB pages when started with

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1

which cuts the faults 150-fold (and the TLB misses of the matmuls with them): measured
update step 0.47-0.51 s -> 0.38-0.42 s, the whole loop 15 % faster (docs/performance.md).

glibc reads tunables only when a process starts, so `jaxrl-llm` re-executes itself once with
the tunable added (`reexec_with_hugepages`, before any XLA work; about 30 ms). Nothing changes
numerically. Opt out with `JAXRL_LLM_HUGEPAGES=0`. Library users who call `jaxrl_llm` from
their own process can export the variable themselves before starting Python.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping, Sequence

TUNABLE_NAME = "glibc.malloc.hugetlb"
TUNABLE = f"{TUNABLE_NAME}=1"
OPT_OUT = "JAXRL_LLM_HUGEPAGES"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
MIN_GLIBC = (2, 35)


def thp_mode(path: str = THP_ENABLED) -> str | None:
    """The kernel's transparent huge page mode (`always`, `madvise` or `never`), the bracketed
    word of `path`; None when the file is missing or unreadable (not Linux, no THP)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library when it is glibc, else None (musl, macOS, Windows)."""
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        return None
    if not name or not name.startswith("glibc "):
        return None
    parts = name.split()[1].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _opted_out(environ: Mapping[str, str]) -> bool:
    value = environ.get(OPT_OUT, "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return True
    if value in ("1", "true", "yes", "on", ""):
        return False
    raise ValueError(f"{OPT_OUT}={environ[OPT_OUT]!r}: expected 1 or 0 (on or off)")


def environment_with_hugepages(
    environ: Mapping[str, str], thp: str | None, glibc: tuple[int, int] | None
) -> dict[str, str] | None:
    """`environ` with `TUNABLE` added to `GLIBC_TUNABLES` (colon-separated), or None when there
    is nothing to do: the tunable (or any `glibc.malloc.hugetlb` setting) is already there,
    `JAXRL_LLM_HUGEPAGES=0`, glibc older than 2.35 or absent, or THP not in `madvise` mode
    (`always` already gives large mappings huge pages; `never` cannot)."""
    if _opted_out(environ) or thp != "madvise" or glibc is None or glibc < MIN_GLIBC:
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if TUNABLE_NAME in current:
        return None
    return {**environ, "GLIBC_TUNABLES": f"{current}:{TUNABLE}" if current else TUNABLE}


def tunables_without_hugepages(tunables: str) -> str:
    """A `GLIBC_TUNABLES` value less any `glibc.malloc.hugetlb` setting (the benchmarks run
    peers without it and ours with it, starting from whatever the caller had).

    Examples:
      >>> tunables_without_hugepages("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
      'glibc.malloc.arena_max=2'
    """
    return ":".join(t for t in tunables.split(":") if t and not t.startswith(TUNABLE_NAME))


def reexec_with_hugepages(argv: Sequence[str] | None = None) -> None:
    """Replace this process by the same command with the tunable set, when it would take
    effect; return (doing nothing) otherwise. `argv` defaults to the interpreter's own command
    line (`sys.orig_argv`, so `python -m jaxrl_llm ...`, the `jaxrl-llm` script and any `-X`
    options run again as they were). Call it before any XLA work: the new process starts over."""
    env = environment_with_hugepages(os.environ, thp_mode(), glibc_version())
    if env is None:
        return
    command = list(argv) if argv is not None else [sys.executable, *sys.orig_argv[1:]]
    if not command or not command[0]:  # an embedded interpreter without an executable
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(command[0], command, env)
    except OSError as err:  # the run goes on, only without huge pages
        warnings.warn(
            f"jaxrl_llm: could not restart with {TUNABLE} ({err}); running without it "
            f"(set {OPT_OUT}=0 to skip the attempt).",
            RuntimeWarning,
            stacklevel=2,
        )
