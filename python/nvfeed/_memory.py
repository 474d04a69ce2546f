# SPDX-License-Identifier: Apache-2.0
"""A session's batch memory, received as a file descriptor: one more unix
connection to loaderd is upgraded, and the daemon answers with one frame
(a 4-byte big-endian length, then msgpack) whose bytes carry the
descriptor as SCM_RIGHTS ancillary data, then closes it. Nothing is named
in a filesystem, so no other user can open it, and nothing is left behind
when the daemon dies; the mapping outlives the daemon, and is unmapped at the
session's close unless a batch still views it."""

from __future__ import annotations

import mmap
import os
import sys
from typing import Optional, cast

import msgpack

from ._upgrade import UpgradeError, upgrade
from ._wire import MemoryResponse

UPGRADE = "nvfeed-memory"


def receive(path: str, session_id: str, timeout: Optional[float]) -> tuple[MemoryResponse, int]:
    """Asks for the session's memory: its description and a descriptor
    the caller owns (and closes). Raises UpgradeError naming what went
    wrong."""
    s, body, fds = upgrade(path, f"/v1/sessions/{session_id}/memory", UPGRADE, b"", timeout, until_eof=True)
    s.close()
    try:
        n = int.from_bytes(body[:4], "big")
        if len(body) < 4 or len(body) < 4 + n:
            raise UpgradeError("the daemon's memory frame is cut short")
        if len(fds) != 1:
            raise UpgradeError(f"the daemon passed {len(fds)} descriptors with the memory frame, want 1")
        r = cast(MemoryResponse, msgpack.unpackb(body[4:4 + n]))
        fd = fds.pop()
        return r, fd
    finally:
        for fd in fds:
            os.close(fd)


def map_host(fd: int, size: int) -> mmap.mmap:
    """Maps host batch memory read-only (shared: the daemon's writes show)."""
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


def unmap_unless_viewed(mm: Optional[mmap.mmap]) -> None:
    """Unmaps ``mm`` now unless anything but the caller's reference holds
    it (a batch handed out, an array over it: numpy holds the mapping, not
    a buffer export, so ``mmap.close`` would not refuse). The session's
    pages then go back at its close, not when the mapping is collected,
    which may be in the middle of the next session's open; else the last
    reference unmaps it.

    Parameters
    ----------
    mm
        The mapping, its only other reference dropped by the caller; None:
        nothing to do.
    """
    # 3: the caller's, this frame's and getrefcount's argument
    if mm is None or sys.getrefcount(mm) > 3:
        return
    try:
        mm.close()
    except BufferError:
        pass  # a buffer export (memoryview) holds it
