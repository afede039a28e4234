"""Byte messages from rank 0 to the ranks of a gloo group: how steps reach ranks on other nodes,
where no shared memory reaches. The CPU tensors travel over TCP whatever the model's backend.

A message is one broadcast of a fixed-size frame (an 8-byte length, then the bytes), plus one
of the remainder when it does not fit. A frame whose length is _KEEP_ALIVE is a keep-alive:
readers skip it; it tells them rank 0 is alive while no step comes (a gloo receive fails after
the group's timeout). Gloo sends wait until the reader is receiving, so writes also fail after
the timeout when a reader hangs.
"""

from __future__ import annotations

import datetime
import struct
import threading
import time

import torch
import torch.distributed as dist

FRAME_BYTES = 32 << 10
_LENGTH = struct.Struct("<Q")
_KEEP_ALIVE = (1 << 64) - 1  # a length no message has (an empty message is a message)


class GlooBroadcast:
    """Create on every member with `GlooBroadcast.create(ranks, timeout_s)`: rank 0 writes,
    the others read. Non-members do not call it."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float) -> None:
        self._group = group
        self._frame = torch.zeros(FRAME_BYTES, dtype=torch.uint8)
        self._lock = threading.Lock()  # the writer's steps and keep-alives, one at a time
        self._last_write = time.monotonic()
        self._timeout_s = timeout_s
        self._closed = threading.Event()

    @classmethod
    def create(cls, ranks: list[int], timeout_s: float) -> GlooBroadcast:
        """Collective over `ranks` only (rank 0 first)."""
        group = dist.new_group(
            ranks,
            backend="gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            use_local_synchronization=True,
        )
        return cls(group, timeout_s)

    def write(self, data: bytes | memoryview) -> None:
        self._write(data, len(data))

    def _write(self, data: bytes | memoryview, length: int) -> None:
        with self._lock:
            self._last_write = time.monotonic()
            room = FRAME_BYTES - _LENGTH.size
            head = bytearray(_LENGTH.pack(length) + data[:room])
            self._frame[: len(head)] = torch.frombuffer(head, dtype=torch.uint8)
            dist.broadcast(self._frame, 0, group=self._group)
            if len(data) > room:
                rest = torch.frombuffer(bytearray(data[room:]), dtype=torch.uint8)
                dist.broadcast(rest, 0, group=self._group)

    def read(self) -> bytes:
        """The next message (keep-alives skipped); raises RuntimeError after the group's
        timeout without a frame, or at once when rank 0's connection closes."""
        while True:
            dist.broadcast(self._frame, 0, group=self._group)
            frame = self._frame.numpy()
            (length,) = _LENGTH.unpack(frame[: _LENGTH.size].tobytes())
            if length == _KEEP_ALIVE:
                continue
            room = FRAME_BYTES - _LENGTH.size
            if length <= room:
                return frame[_LENGTH.size : _LENGTH.size + length].tobytes()
            rest = torch.empty(length - room, dtype=torch.uint8)
            dist.broadcast(rest, 0, group=self._group)
            return frame[_LENGTH.size :].tobytes() + rest.numpy().tobytes()

    def start_keep_alive(self, on_error) -> None:
        """Rank 0: writes a keep-alive whenever no message went out for a quarter of the
        timeout (at most every 5 s), on a daemon thread, until stop_keep_alive().
        on_error(exception) runs once if one fails (a reader is gone or hung); then it stops."""
        interval = min(5.0, self._timeout_s / 4)

        def run() -> None:
            while not self._closed.wait(interval / 4):
                if time.monotonic() - self._last_write < interval:
                    continue
                try:
                    self._write(b"", _KEEP_ALIVE)
                except Exception as e:
                    if not self._closed.is_set():
                        on_error(e)
                    return

        threading.Thread(target=run, name="minivllm-keep-alive", daemon=True).start()

    def stop_keep_alive(self) -> None:
        """Before the last message (SHUTDOWN): no keep-alive may follow it."""
        self._closed.set()
