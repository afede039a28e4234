"""A shared-memory ring buffer: one writer broadcasts byte messages to N readers on one node.

Layout: `num_slots` data slots of `slot_bytes`, then one flag row per slot: byte 0 is
"written", byte 1 + r is "read by reader r". A message larger than a slot spans consecutive
slots (each slot's header says how many bytes it holds and whether more follow).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory

# Per slot: payload bytes in this slot (uint32), 1 if the message continues in the next slot.
_HEADER = struct.Struct("<IB")
# Readers spin (yielding the CPU) this long after their last message, then sleep in
# growing naps up to _MAX_NAP_S: steps arrive back to back, idle periods cost no CPU.
_SPIN_S = 0.05
_MAX_NAP_S = 0.002
# How often a waiting side calls its liveness check.
_CHECK_EVERY_S = 0.1

Check = Callable[[], None]


def _fence(lock: threading.Lock) -> None:
    """A full memory barrier: a lock acquire/release orders our loads and stores against the
    other processes' (vLLM's shm_broadcast relies on the same property)."""
    with lock:
        pass


@dataclass(frozen=True)
class RingHandle:
    """What a reader needs to attach: plain data, sent to worker processes."""

    name: str
    num_readers: int
    num_slots: int
    slot_bytes: int


class ShmRing:
    """Create with `ShmRing.create(...)` (the writer) and `ShmRing.attach(handle, r)`."""

    def __init__(
        self,
        shm: shared_memory.SharedMemory | mmap.mmap,
        handle: RingHandle,
        reader: int | None,
    ) -> None:
        self._shm = shm  # the writer's SharedMemory (it unlinks it), or a reader's mapping
        self.handle = handle
        self.reader = reader  # None: this side is the writer
        self._buf = shm.buf if reader is None else memoryview(shm)
        self._flags_at = handle.num_slots * handle.slot_bytes
        self._row = 1 + handle.num_readers
        self._slot = 0  # next slot to write (writer) or to read (reader)
        self._lock = threading.Lock()
        self._last_read = time.monotonic()

    @classmethod
    def create(cls, num_readers: int, num_slots: int = 8, slot_bytes: int = 1 << 20) -> ShmRing:
        if num_readers < 1 or num_slots < 2 or slot_bytes <= _HEADER.size:
            raise ValueError("a ring needs >= 1 reader, >= 2 slots, slots larger than a header")
        size = num_slots * slot_bytes + num_slots * (1 + num_readers)
        shm = shared_memory.SharedMemory(create=True, size=size)
        shm.buf[num_slots * slot_bytes : size] = bytes(size - num_slots * slot_bytes)
        return cls(shm, RingHandle(shm.name, num_readers, num_slots, slot_bytes), None)

    @classmethod
    def attach(cls, handle: RingHandle, reader: int) -> ShmRing:
        if not 0 <= reader < handle.num_readers:
            raise ValueError(f"reader {reader} out of range [0, {handle.num_readers})")
        # A plain mapping of the segment, not SharedMemory: that would register it with this
        # process's resource tracker, which unlinks it at exit (the writer owns it).
        size = handle.num_slots * (handle.slot_bytes + 1 + handle.num_readers)
        fd = os.open(f"/dev/shm/{handle.name.lstrip('/')}", os.O_RDWR)
        try:
            shm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(shm, handle, reader)

    # ---- writer ----------------------------------------------------------------------------

    def write(self, data: bytes | memoryview, check: Check | None = None) -> None:
        """Broadcasts one message. Waits while the next slot is unread by some reader; calls
        check() every so often meanwhile (it raises when a reader is known to be gone)."""
        assert self.reader is None, "only the writer writes"
        room = self.handle.slot_bytes - _HEADER.size
        view = memoryview(data).cast("B")
        start = 0
        while True:
            part = view[start : start + room]
            start += len(part)
            more = start < len(view)
            self._write_slot(part, more, check)
            if not more:
                return

    def _write_slot(self, part: memoryview, more: bool, check: Check | None) -> None:
        flags = self._flags_at + self._slot * self._row
        buf, n = self._buf, self.handle.num_readers
        waited_since = None
        while True:
            _fence(self._lock)
            if not buf[flags] or sum(buf[flags + 1 : flags + 1 + n]) == n:
                break
            waited_since = self._wait(waited_since, check)
        buf[flags] = 0
        at = self._slot * self.handle.slot_bytes
        _HEADER.pack_into(buf, at, len(part), more)
        buf[at + _HEADER.size : at + _HEADER.size + len(part)] = part
        buf[flags + 1 : flags + 1 + n] = bytes(n)  # unread by all, before it is marked written
        _fence(self._lock)
        buf[flags] = 1
        _fence(self._lock)
        self._slot = (self._slot + 1) % self.handle.num_slots

    # ---- reader ----------------------------------------------------------------------------

    def read(self, check: Check | None = None) -> bytes:
        """Waits for the next message and returns it; calls check() every so often while
        waiting (it raises when the writer is known to be gone)."""
        assert self.reader is not None, "only readers read"
        parts = []
        while True:
            part, more = self._read_slot(check)
            parts.append(part)
            if not more:
                self._last_read = time.monotonic()
                return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_slot(self, check: Check | None) -> tuple[bytes, bool]:
        flags = self._flags_at + self._slot * self._row
        mine = flags + 1 + self.reader
        buf = self._buf
        waited_since = None
        while True:
            _fence(self._lock)
            if buf[flags] and not buf[mine]:
                break
            waited_since = self._wait(waited_since, check)
        at = self._slot * self.handle.slot_bytes
        length, more = _HEADER.unpack_from(buf, at)
        part = bytes(buf[at + _HEADER.size : at + _HEADER.size + length])
        _fence(self._lock)
        buf[mine] = 1
        _fence(self._lock)
        self._slot = (self._slot + 1) % self.handle.num_slots
        return part, bool(more)

    # ---- both ------------------------------------------------------------------------------

    def _wait(self, waited_since: float | None, check: Check | None) -> float:
        now = time.monotonic()
        if waited_since is None:
            self._next_check = now + _CHECK_EVERY_S
            waited_since = now
        if check is not None and now >= self._next_check:
            self._next_check = now + _CHECK_EVERY_S
            check()
        idle = now - max(waited_since, self._last_read)
        if now - self._last_read < _SPIN_S or idle < _SPIN_S:
            os.sched_yield()
        else:
            time.sleep(min(_MAX_NAP_S, idle / 100))
        return waited_since

    def close(self) -> None:
        """Detaches; the writer also removes the segment."""
        if self._shm is None:
            return
        self._buf.release()
        self._buf = None
        shm, self._shm = self._shm, None
        shm.close()
        if self.reader is None:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
