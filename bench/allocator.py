"""The benchmarks' allocator (torch-free: bench/common.py's runners and bench/callgrind.py's
valgrind worker start on it alike).

The process keeps freed memory and hands it out again, so that a timed call reuses the pages of
the call before instead of faulting fresh ones in (on the development VMs a fresh 64 MiB costs
about 18 ms of page faults, for every provider alike, which would hide the kernels being
measured). glibc cannot be made to: its default gives blocks of 32 MiB and more back to the
kernel at free(), and with ALLOCATOR_TUNABLES it keeps them, but its posix_memalign (c10's CPU
allocator) does not hand a freed block of the size asked for back (docs/architecture.md,
Benchmarks). jemalloc with purging off (JEMALLOC_CONF) does; glibc with the tunables is the
fallback where jemalloc is not installed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Optional

JEMALLOC = "libjemalloc.so.2"
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
ALLOCATOR_TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296"
_ALLOCATOR_SET = "TECPP_BENCH_ALLOCATOR"  # set in the re-executed process


def benchmark_allocator_env(environ: dict, jemalloc: Optional[str]) -> Optional[dict]:
    """The environment to re-execute a benchmark in (None: run as is): jemalloc preloaded with
    JEMALLOC_CONF where it is installed (``jemalloc``: its library, None where it is not),
    else glibc with ALLOCATOR_TUNABLES; as is where TECPP_BENCH_SYSTEM_MALLOC asks for the
    system's defaults or the process was already re-executed."""
    if environ.get("TECPP_BENCH_SYSTEM_MALLOC") or environ.get(_ALLOCATOR_SET):
        return None
    env = dict(environ, **{_ALLOCATOR_SET: "jemalloc" if jemalloc else "glibc"})
    if jemalloc:
        preload = [p for p in environ.get("LD_PRELOAD", "").split(":") if p and p != jemalloc]
        env["LD_PRELOAD"] = ":".join([jemalloc] + preload)
        env["MALLOC_CONF"] = JEMALLOC_CONF
    else:
        env["GLIBC_TUNABLES"] = ALLOCATOR_TUNABLES
    return env


def worker_env(environ: dict) -> dict:
    """A child process's environment on the benchmarks' allocator, whether or not its parent
    runs on it (bench/callgrind.py's valgrind worker)."""
    environ = {k: v for k, v in environ.items() if k != _ALLOCATOR_SET}
    return benchmark_allocator_env(environ, ctypes.util.find_library("jemalloc")) or environ


def ensure_benchmark_allocator() -> None:
    """Re-executes this process once in benchmark_allocator_env's environment."""
    jemalloc = ctypes.util.find_library("jemalloc")
    env = benchmark_allocator_env(dict(os.environ), jemalloc)
    if env is None:
        return
    if not jemalloc:
        print(f"[bench] {JEMALLOC} not found (Debian: apt-get install libjemalloc2): glibc "
              "malloc, whose memalign may fault fresh pages in for big outputs",
              file=sys.stderr, flush=True)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def _jemalloc_version() -> Optional[str]:
    """The version of the jemalloc serving this process's malloc (None: not jemalloc)."""
    mallctl = getattr(ctypes.CDLL(None), "mallctl", None)
    if mallctl is None:
        return None
    version, size = ctypes.c_char_p(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_char_p))
    if mallctl(b"version", ctypes.byref(version), ctypes.byref(size), None, 0) != 0:
        return None
    return version.value.decode().split("-")[0]


def allocator_note() -> str:
    """The allocator this process runs on, as the report's Machine line states it."""
    version = _jemalloc_version()
    if version:
        return f"jemalloc {version} (MALLOC_CONF={os.environ.get('MALLOC_CONF', '')})"
    tun = os.environ.get("GLIBC_TUNABLES")
    return f"glibc malloc, GLIBC_TUNABLES={tun}" if tun else "glibc malloc, system defaults"
