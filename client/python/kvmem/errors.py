"""Typed errors: every failed call raises a KvmemError carrying the gRPC code."""
from __future__ import annotations

import re
from typing import Optional

import grpc

# Trailing metadata naming the server that owns a stream (kvmem-server --etcd).
OWNER_HEADER = "kvmem-owner"
# Trailing metadata of a FetchBlocks refused for room: the blocks it sent
# whole before the refusal.
BLOCKS_SENT_HEADER = "kvmem-blocks-sent"
_LAST_DURABLE = re.compile(r"last durable frame is (-?\d+)")
_CODE_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


class KvmemError(Exception):
    """A call failed. ``code`` is the grpc.StatusCode, ``message`` the server's
    status message. ``last_durable_frame`` is set when the message names it
    (a failed append: resume at last_durable_frame + 1)."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 owner: Optional[str] = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        # UNAVAILABLE because another server owns the stream: its address
        # (trailing metadata kvmem-owner); the client routes there itself.
        self.owner = owner
        m = _LAST_DURABLE.search(message)
        self.last_durable_frame: Optional[int] = int(m.group(1)) if m else None
        # A FetchBlocks refused for room: the blocks sent whole before it
        # (trailing metadata kvmem-blocks-sent; error_from_rpc sets it).
        self.blocks_sent: Optional[int] = None


class InvalidArgumentError(KvmemError):
    """INVALID_ARGUMENT: a field or value is wrong; the message names it."""


class NotFoundError(KvmemError):
    """NOT_FOUND: unknown stream or block."""


class AlreadyExistsError(KvmemError):
    """ALREADY_EXISTS: stream id in use with another config, or frame stored."""


class FailedPreconditionError(KvmemError):
    """FAILED_PRECONDITION: closed stream or frame out of order."""


class ResourceExhaustedError(KvmemError):
    """RESOURCE_EXHAUSTED: a quota or limit of the server (the message names it)."""


class UnauthenticatedError(KvmemError):
    """UNAUTHENTICATED: missing or wrong API key."""


class PermissionDeniedError(KvmemError):
    """PERMISSION_DENIED."""


class UnavailableError(KvmemError):
    """UNAVAILABLE: the server cannot be reached (or went away)."""


class DeadlineExceededError(KvmemError):
    """DEADLINE_EXCEEDED: the call's timeout passed."""


_CLASS_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def error_for(code: grpc.StatusCode, message: str,
              owner: Optional[str] = None) -> KvmemError:
    """The KvmemError subclass for a status code."""
    return _CLASS_BY_CODE.get(code, KvmemError)(code, message, owner)


def error_from_code_value(value: int, message: str,
                          owner: Optional[str] = None) -> KvmemError:
    """From a google.rpc.Code number (SessionError.code)."""
    return error_for(_CODE_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN), message,
                     owner or None)


def error_from_rpc(e: grpc.RpcError) -> KvmemError:
    """From the exception gRPC raised (a grpc.Call with code() and details())."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    owner = None
    sent = None
    if hasattr(e, "trailing_metadata"):
        for key, value in e.trailing_metadata() or ():
            if key == OWNER_HEADER:
                owner = value
            elif (key == BLOCKS_SENT_HEADER and isinstance(value, str)
                  and value.isascii() and value.isdigit()):
                sent = int(value)
    err = error_for(code or grpc.StatusCode.UNKNOWN, details or "", owner)
    err.blocks_sent = sent
    return err
