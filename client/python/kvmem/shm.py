"""Shared-memory delivery (same host, unix-socket target): the server places
recalled KV in an arena the client maps read-only, and answers with offsets.

The protocol (kvmem.v1.KvMemory.AttachSharedMemory): the server creates a
sealed memfd for the caller and answers with its id, a one-time token and a
hand-off socket; the client connects there, sends the token and receives
the arena's id and size (two little-endian uint64) with a read-only file
descriptor (SCM_RIGHTS), maps it, and keeps that connection open: closing it,
or the process dying, frees the arena. Views are numpy arrays over the
mapping (read-only), valid until their Delivery is released.
"""
from __future__ import annotations

import mmap
import socket
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import grpc
import numpy as np

from kvmem.errors import error_for
from kvmem.kv import decode_kv
from kvmem.messages import RecalledBlock, StreamGeometry

if TYPE_CHECKING:
    from kvmem.client import Client


class Arena:
    """A mapped arena and the hand-off connection that keeps it alive."""

    def __init__(self, resp) -> None:
        self.id = resp.arena_id
        self.size = resp.bytes
        self.lease_ms = resp.lease_ms
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(resp.socket_path)
            self._sock.sendall(resp.token.encode())
            data, fds, _, _ = socket.recv_fds(self._sock, 16, 1)
        except OSError as e:
            self._sock.close()
            raise error_for(grpc.StatusCode.UNAVAILABLE,
                            f"shared-memory hand-off failed: {e}") from None
        if len(data) != 16 or len(fds) != 1 or \
                struct.unpack("<QQ", data) != (resp.arena_id, resp.bytes):
            for fd in fds:
                socket.close(fd)
            self._sock.close()
            raise error_for(grpc.StatusCode.UNAVAILABLE,
                            "the server refused the arena token (expired, or used)")
        try:
            self.map = mmap.mmap(fds[0], self.size, flags=mmap.MAP_SHARED,
                                 prot=mmap.PROT_READ)
        finally:
            socket.close(fds[0])

    def close(self) -> None:
        """Closes the hand-off connection (the server then frees the arena)
        and the mapping, unless delivered views still use it: it then goes
        with the last of them."""
        self._sock.close()
        try:
            self.map.close()
        except BufferError:
            pass

    def view(self, offset: int, length: int) -> memoryview:
        if offset + length > self.size:
            raise error_for(grpc.StatusCode.DATA_LOSS,
                            f"the server placed {length} bytes at {offset}, "
                            f"outside the {self.size}-byte arena")
        return memoryview(self.map)[offset:offset + length]


@dataclass
class SharedBlock:
    """One delivered block: its bytes (a read-only view) and, for
    BLOCK_LAYER_MAJOR and TOKEN_LAYER_MAJOR, kv as (layers, 2, kv_heads,
    tokens, head_dim); token_offsets: TOKEN_LAYER_MAJOR's tokens (offsets in
    the block), in kv's token order."""

    block_id: int
    data: memoryview
    info: Optional[RecalledBlock] = None
    kv: Optional[np.ndarray] = None
    token_offsets: Optional[list[int]] = None


@dataclass
class Delivery:
    """Blocks delivered through shared memory (or inline) under one lease.
    release() gives the lease back; a lease the server reclaimed first (held
    past lease_ms) raises KvmemError DATA_LOSS: its bytes may have been
    overwritten while read. Usable as a context manager."""

    blocks: list[SharedBlock] = field(default_factory=list)
    lease_id: int = 0
    nbytes: int = 0
    _client: Optional["Client"] = None
    _arena: Optional[Arena] = None

    def release(self) -> None:
        lease, arena = self.lease_id, self._arena
        self.lease_id, self._arena, self.blocks = 0, None, []
        if lease == 0 or arena is None or self._client is None:
            return
        self._client._release(arena, lease)

    def release_later(self) -> None:
        """Gives the lease back with the client's next shared-memory fetch or
        recall (no round trip of its own); expiry is not reported."""
        lease, arena = self.lease_id, self._arena
        self.lease_id, self._arena, self.blocks = 0, None, []
        if lease and arena is not None and self._client is not None:
            self._client._defer_release(arena, lease)

    def __enter__(self) -> "Delivery":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def block_views(arena: Optional[Arena], geometry: StreamGeometry, layers: int,
                layer_major: bool, items) -> list[SharedBlock]:
    """SharedBlocks of (block_id, info, region or inline bytes[, token
    offsets]) items."""
    out = []
    for item in items:
        block_id, info, region, inline = item[:4]
        tokens = list(item[4]) if len(item) > 4 and item[4] is not None else None
        data = memoryview(inline) if region is None else \
            arena.view(region.offset, region.length)
        kv = decode_kv(geometry, data, layers) if layer_major else None
        out.append(SharedBlock(block_id=block_id, data=data, info=info, kv=kv,
                               token_offsets=tokens))
    return out
