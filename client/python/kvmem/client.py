"""The kvmem client: a typed wrapper over the generated kvmem.v1 stubs."""
from __future__ import annotations

import itertools
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Union

import grpc
import numpy as np

from kvmem import _pb
from kvmem.errors import (KvmemError, error_for, error_from_code_value,
                          error_from_rpc)
from kvmem.kv import decode_kv, encode_frame
from kvmem.shm import Arena, Delivery, block_views
from kvmem.messages import (AppendAck, AppendFramesResponse, FrameSignals,
                            OpenStreamResponse, PayloadLayout, RecalledBlock,
                            RecallResponse, StreamConfig, StreamGeometry,
                            StreamStats, from_proto, to_proto)

pb = _pb.service_pb2
types_pb = _pb.types_pb2

# Metadata every per-stream call carries: proxies shard streams by it
# (nginx: hash $http_kvmem_stream_id consistent).
STREAM_ID_HEADER = "kvmem-stream-id"
DEFAULT_CHUNK_BYTES = 1 << 20
_END = object()
# Lease ids one call may release (the server refuses more).
_MAX_RELEASES_PER_CALL = 65536


@dataclass
class Frame:
    """One frame to append.

    kv: (layers, 2, kv_heads, tokens, head_dim), [:, 0] the keys and [:, 1]
    the values (see kvmem.kv). frame_index and first_token_position default to
    the stream's next frame and the end of the previous frame.
    """

    kv: np.ndarray
    frame_index: Optional[int] = None
    first_token_position: Optional[int] = None
    timestamp_us: int = 0
    signals: Optional[FrameSignals] = None


FrameLike = Union[Frame, np.ndarray]


@dataclass
class FetchedBlock:
    """One block from FetchBlocks.

    kv is (len(layers), 2, kv_heads, tokens, head_dim) for either layout (for
    FRAME_MAJOR the frames joined along the token axis); payload is the bytes
    as received. FRAME_MAJOR also gives each frame as appended in frames, with
    its index in frame_indices; TOKEN_LAYER_MAJOR the tokens kv holds (offsets
    in the block, in kv's order) in token_offsets.
    """

    info: RecalledBlock
    layout: PayloadLayout
    layers: list[int]
    payload: bytes
    kv: np.ndarray
    frame_indices: list[int] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    token_offsets: Optional[list[int]] = None


def _read_pem(v: Union[None, bytes, str, os.PathLike]) -> Optional[bytes]:
    if v is None or isinstance(v, bytes):
        return v
    with open(v, "rb") as f:
        return f.read()


def _as_frame(f: FrameLike) -> Frame:
    return f if isinstance(f, Frame) else Frame(kv=f)


def _frame_messages(header: "types_pb.FrameHeader", payload: bytes,
                    chunk_bytes: int) -> Iterator[tuple[str, object]]:
    """The header carrying the first chunk_bytes of payload, then chunks."""
    header.payload_bytes = len(payload)
    header.payload = payload[:chunk_bytes]
    yield "frame", header
    for off in range(chunk_bytes, len(payload), chunk_bytes):
        yield "chunk", types_pb.PayloadChunk(
            frame_index=header.frame_index, offset=off,
            data=payload[off:off + chunk_bytes])


def _recall_request(stream_id: str, query, *, top_k: int, max_tokens: int,
                    window_fraction: float, current_token_position: int,
                    signals: Optional[FrameSignals], per_layer: bool,
                    priority: int, window_lse=None,
                    per_head: bool = False,
                    identity_share: Optional[float] = None,
                    mass_target: float = 0.0) -> "pb.RecallRequest":
    q = np.asarray(query, dtype=np.float32).ravel()
    req = pb.RecallRequest(stream_id=stream_id,
                           current_token_position=current_token_position,
                           per_layer=per_layer, priority=priority, per_head=per_head)
    req.query.extend(q.tolist())
    if window_lse is not None:
        req.window_lse.extend(np.asarray(window_lse, dtype=np.float32).ravel().tolist())
    req.budget.top_k = top_k
    req.budget.max_tokens = max_tokens
    req.budget.window_fraction = window_fraction
    if identity_share is not None:
        req.budget.identity_share = identity_share
    req.budget.mass_target = mass_target
    if signals is not None:
        to_proto(signals, req.signals)
    return req


class _Cursor:
    """Where a stream's next frame goes."""

    __slots__ = ("frame", "position")

    def __init__(self, frame: int, position: int) -> None:
        self.frame = frame
        self.position = position


_SENT = re.compile(r"FetchBlocks sent (\d+) of \d+ blocks")


def _blocks_sent_before_refusal(err: KvmemError) -> int:
    """The whole blocks a FetchBlocks refusal for room was sent with: its
    trailing metadata's count (kvmem-blocks-sent), else what its message
    says (a server before the header); -1 for any other error."""
    if err.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return -1
    if err.blocks_sent is not None:
        return err.blocks_sent
    m = _SENT.match(err.message or "")
    return int(m.group(1)) if m else -1


class Client:
    """A connection to kvmem-server. Thread-safe (one gRPC channel).

    target: "host:port", "unix:/path/to.sock" or "unix:///abs/path".
    api_key: sent on every call as "authorization: Bearer <key>" (servers run
    with --api_keys_file). root_certificates (PEM bytes or a file path):
    connect with TLS; certificate_chain/private_key add a client certificate;
    server_name overrides the name checked in the server's certificate.
    timeout: default deadline of each unary call and FetchBlocks, seconds
    (None: none). AppendFrames and Session calls live as long as a camera
    does: they get a deadline only when one is passed to them.

    Every call naming a stream sends the metadata "kvmem-stream-id: <id>".
    Failed calls raise KvmemError (kvmem.errors) with the gRPC code.
    """

    def __init__(self, target: str, *, api_key: Optional[str] = None,
                 root_certificates: Union[None, bytes, str, os.PathLike] = None,
                 certificate_chain: Union[None, bytes, str, os.PathLike] = None,
                 private_key: Union[None, bytes, str, os.PathLike] = None,
                 server_name: Optional[str] = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_message_bytes: int = 64 << 20,
                 timeout: Optional[float] = None,
                 max_redirects: int = 3) -> None:
        if chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")
        if max_redirects < 0:
            raise ValueError(f"max_redirects is {max_redirects}; use 0 or more")
        options = [("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.max_receive_message_length", max_message_bytes)]
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(root_certificates),
                private_key=_read_pem(private_key),
                certificate_chain=_read_pem(certificate_chain))
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self._make_channel = lambda t: grpc.secure_channel(t, creds, options=options)
        else:
            self._make_channel = lambda t: grpc.insecure_channel(t, options=options)
        self._channel = self._make_channel(target)
        self._stub = _pb.service_pb2_grpc.KvMemoryStub(self._channel)
        # Streams another server owns (servers sharing a store answer
        # UNAVAILABLE with the owner in the trailing metadata kvmem-owner):
        # stream id -> owner's target, and a channel per owner.
        self.max_redirects = max_redirects
        self._routes: dict[str, str] = {}
        self._owners: dict[str, tuple] = {}
        self.target = target
        self.chunk_bytes = chunk_bytes
        self.timeout = timeout
        self._auth: list[tuple[str, str]] = (
            [("authorization", "Bearer " + api_key)] if api_key else [])
        self._lock = threading.Lock()
        self._arena: Optional[Arena] = None
        self._deferred: list[tuple[int, int]] = []  # (arena id, lease id)
        self.shm_arena_bytes = 256 << 20
        self._geometry: dict[str, StreamGeometry] = {}
        self._cursor: dict[str, _Cursor] = {}

    # -- plumbing ---------------------------------------------------------

    @property
    def stub(self) -> "_pb.service_pb2_grpc.KvMemoryStub":
        """The raw generated stub, for what the wrapper does not cover."""
        return self._stub

    def metadata(self, stream_id: Optional[str] = None) -> list[tuple[str, str]]:
        """The metadata a call sends (authorization, kvmem-stream-id)."""
        md = list(self._auth)
        if stream_id is not None:
            md.append((STREAM_ID_HEADER, stream_id))
        return md

    def route(self, stream_id: str) -> str:
        """Where the stream's calls go: the target, or its owner's address
        after a redirect."""
        with self._lock:
            return self._routes.get(stream_id, self.target)

    def _stub_for(self, stream_id: Optional[str]):
        with self._lock:
            owner = self._routes.get(stream_id) if stream_id is not None else None
            if owner is None:
                return self._stub
            if owner not in self._owners:
                ch = self._make_channel(owner)
                self._owners[owner] = (ch, _pb.service_pb2_grpc.KvMemoryStub(ch))
            return self._owners[owner][1]

    def _learn(self, stream_id: Optional[str], err: KvmemError) -> bool:
        """Records the owner a refusal named; True when the route changed.
        An UNAVAILABLE naming no owner from a redirect's target (gone, or no
        longer holding the stream) sends the stream back to the first guess."""
        if stream_id is None:
            return False
        if not err.owner:
            if err.code != grpc.StatusCode.UNAVAILABLE:
                return False
            with self._lock:
                return self._routes.pop(stream_id, None) is not None
        with self._lock:
            now = self._routes.get(stream_id, self.target)
            if err.owner == now:
                return False
            if err.owner == self.target:
                self._routes.pop(stream_id, None)
            else:
                self._routes[stream_id] = err.owner
        return True

    def _call(self, method, request, stream_id: Optional[str], timeout,
              use_default: bool = True):
        """method: a KvMemory method name (routed by stream, redirects
        followed) or a bound stub method (sent as is)."""
        if timeout is None and use_default:
            timeout = self.timeout
        for hop in range(self.max_redirects + 1):
            fn = (getattr(self._stub_for(stream_id), method)
                  if isinstance(method, str) else method)
            try:
                return fn(request, metadata=self.metadata(stream_id), timeout=timeout)
            except grpc.RpcError as e:
                err = error_from_rpc(e)
            # A stream of requests cannot be sent again: learn the route only.
            replay = isinstance(method, str) and method != "AppendFrames"
            if not (self._learn(stream_id, err) and replay and hop < self.max_redirects):
                raise err from None
        raise err from None

    def _remember(self, stats: StreamStats) -> None:
        with self._lock:
            self._geometry[stats.stream_id] = stats.config.geometry
            self._cursor[stats.stream_id] = _Cursor(
                stats.last_durable_frame + 1, stats.next_token_position)

    def _forget(self, stream_id: str) -> None:
        with self._lock:
            self._geometry.pop(stream_id, None)
            self._cursor.pop(stream_id, None)

    def geometry(self, stream_id: str) -> StreamGeometry:
        """The stream's geometry (asked once, then cached)."""
        with self._lock:
            g = self._geometry.get(stream_id)
        return g if g is not None else self.stats(stream_id).config.geometry

    def _next(self, stream_id: str) -> _Cursor:
        with self._lock:
            c = self._cursor.get(stream_id)
        if c is None:
            self.stats(stream_id)
            with self._lock:
                c = self._cursor[stream_id]
        return _Cursor(c.frame, c.position)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Waits until the channel is connected; UnavailableError otherwise."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise error_for(grpc.StatusCode.UNAVAILABLE,
                            f"{self.target} not reachable within {timeout} s") from None

    def close(self) -> None:
        """Closes the channel and the shared-memory arena (tensors and views
        delivered into it stay readable until they are dropped)."""
        with self._lock:
            arena, self._arena = self._arena, None
        if arena is not None:
            arena.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- streams ----------------------------------------------------------

    def open_stream(self, stream_id: str, config: StreamConfig,
                    timeout: Optional[float] = None) -> OpenStreamResponse:
        """Creates the stream, or reopens it when the config is equal
        (AlreadyExistsError when it differs)."""
        req = pb.OpenStreamRequest(stream_id=stream_id)
        to_proto(config, req.config)
        resp = from_proto(OpenStreamResponse,
                          self._call("OpenStream", req, stream_id, timeout))
        self._remember(resp.stats)
        return resp

    def close_stream(self, stream_id: str, timeout: Optional[float] = None) -> StreamStats:
        """Seals the open block; the stream takes no more frames."""
        resp = self._call("CloseStream",
                          pb.CloseStreamRequest(stream_id=stream_id), stream_id, timeout)
        stats = from_proto(StreamStats, resp.stats)
        self._remember(stats)
        return stats

    def delete_stream(self, stream_id: str, timeout: Optional[float] = None) -> None:
        """Removes the stream and all its data."""
        self._forget(stream_id)
        self._call("DeleteStream",
                   pb.DeleteStreamRequest(stream_id=stream_id), stream_id, timeout)

    def list_streams(self, timeout: Optional[float] = None) -> list[StreamStats]:
        resp = self._call(self._stub.ListStreams, pb.ListStreamsRequest(), None, timeout)
        out = [from_proto(StreamStats, s) for s in resp.streams]
        for s in out:
            self._remember(s)
        return out

    def stats(self, stream_id: str, timeout: Optional[float] = None) -> StreamStats:
        """GetStreamStats."""
        s = from_proto(StreamStats, self._call(
            "GetStreamStats", pb.GetStreamStatsRequest(stream_id=stream_id),
            stream_id, timeout))
        self._remember(s)
        return s

    # -- frames -----------------------------------------------------------

    def append_frames(self, stream_id: str, frames: Iterable[FrameLike], *,
                      chunk_bytes: Optional[int] = None,
                      timeout: Optional[float] = None) -> AppendFramesResponse:
        """Uploads frames in order over one AppendFrames call.

        Each frame is a Frame or a bare (layers, 2, kv_heads, tokens, head_dim)
        array; payloads are split into a FrameHeader and PayloadChunks of
        chunk_bytes (default: the client's). Frames are encoded as they are
        sent, so a generator keeps memory bounded. On a server error the
        exception's last_durable_frame says where to resume; a frame that does
        not fit the geometry raises ValueError after the frames before it are
        stored.
        """
        chunk = chunk_bytes or self.chunk_bytes
        it = iter(frames)
        head = next(it, _END)
        if head is _END:  # Nothing to send (an empty call would not name the stream).
            return AppendFramesResponse(
                last_durable_frame=self.stats(stream_id, timeout).last_durable_frame)
        frames = itertools.chain([head], it)
        geometry = self.geometry(stream_id)
        cursor = self._next(stream_id)
        failure: list[BaseException] = []

        def requests() -> Iterator["pb.AppendFramesRequest"]:
            first = True
            while True:
                try:
                    f = next(frames, _END)
                    if f is _END:
                        return
                    f = _as_frame(f)
                    tokens, payload = encode_frame(geometry, f.kv)
                except Exception as e:  # Raised once the call has ended.
                    failure.append(e)
                    return
                header = _header(f, tokens, cursor)
                for kind, msg in _frame_messages(header, payload, chunk):
                    req = pb.AppendFramesRequest(**{kind: msg})
                    if first:
                        req.stream_id = stream_id
                        first = False
                    yield req

        try:
            resp = self._call("AppendFrames", requests(), stream_id, timeout,
                              use_default=False)
        except KvmemError:
            self._forget_cursor(stream_id)
            raise
        if failure:
            self._forget_cursor(stream_id)
            raise failure[0]
        with self._lock:
            self._cursor[stream_id] = _Cursor(resp.last_durable_frame + 1, cursor.position)
        return from_proto(AppendFramesResponse, resp)

    def _forget_cursor(self, stream_id: str) -> None:
        with self._lock:
            self._cursor.pop(stream_id, None)

    # -- recall -----------------------------------------------------------

    def recall(self, stream_id: str, query, *, top_k: int = 0, max_tokens: int = 0,
               window_fraction: float = 0.0, current_token_position: int = 0,
               signals: Optional[FrameSignals] = None, per_layer: bool = False,
               priority: int = 0, window_lse=None, per_head: bool = False,
               identity_share: Optional[float] = None, mass_target: float = 0.0,
               timeout: Optional[float] = None) -> RecallResponse:
        """The budgeted recall set for a query.

        query: one or more query vectors of summary_dim floats each,
        [indexed_layer][kv_head][head_dim] (any array of n * summary_dim
        elements, e.g. shape (n, summary_dim); sent as fp32; up to 1,024,
        more than 16 reduced in the server). window_lse: optional, n *
        (indexed layers x kv_heads) log-sum-exps of each vector over what the
        front end holds (kvmem.v1.RecallRequest.window_lse). per_head: a set
        per indexed layer and KV head, in layer_sets. identity_share: the
        identity channel's share of the budget (None: the stream's);
        mass_target: stop each set once its estimated share of the cold mass
        reaches it (0: fill the budget). Zero budget fields take the
        stream's defaults.
        """
        req = _recall_request(stream_id, query, top_k=top_k, max_tokens=max_tokens,
                              window_fraction=window_fraction,
                              current_token_position=current_token_position,
                              signals=signals, per_layer=per_layer, priority=priority,
                              window_lse=window_lse, per_head=per_head,
                              identity_share=identity_share,
                              mass_target=mass_target)
        return from_proto(RecallResponse,
                          self._call("Recall", req, stream_id, timeout))

    def fetch_blocks(self, stream_id: str, block_ids: Sequence[int], *,
                     layout: PayloadLayout = PayloadLayout.FRAME_MAJOR,
                     layers: Optional[Sequence[int]] = None,
                     max_chunk_bytes: int = 0,
                     tokens: Optional[Mapping[int, Sequence[int]]] = None,
                     timeout: Optional[float] = None) -> list[FetchedBlock]:
        """The KV of the given blocks as numpy arrays, in request order.

        layers (BLOCK_LAYER_MAJOR, TOKEN_LAYER_MAJOR): the layers to send, in
        this order; None means all. tokens (TOKEN_LAYER_MAJOR only): block id
        -> the token offsets to send of it (increasing); blocks not named send
        all their tokens.

        A server that refuses the next block for room in the caller's share
        of --max_queued_response_bytes ("FetchBlocks sent N of M blocks":
        other fetches of the tenant hold it until they are read) is asked
        again for the blocks not yet received, after 20, 40, ... 320 ms
        without progress (about 0.6 s); then its refusal is raised. timeout
        bounds each of those calls.
        """
        geometry = self.geometry(stream_id)
        req = pb.FetchBlocksRequest(stream_id=stream_id, block_ids=list(block_ids),
                                    max_chunk_bytes=max_chunk_bytes,
                                    layout=int(layout), layers=list(layers or []),
                                    tokens=_block_tokens(tokens))
        want_layers = list(layers) if layers else list(range(geometry.layers))
        blocks = self._fetch_resuming(req, stream_id, timeout)
        out = []
        for b in blocks:
            payload = b"".join(b["parts"])
            info = from_proto(RecalledBlock, b["info"])
            if layout in _LAYER_MAJOR:
                kv = decode_kv(geometry, payload, len(want_layers))
                out.append(FetchedBlock(
                    info=info, layout=PayloadLayout(layout), layers=want_layers,
                    payload=payload, kv=kv,
                    token_offsets=_fetched_tokens(layout, dict(tokens or {}), b["id"],
                                                  info.token_count)))
                continue
            frames, indices, off = [], [], 0
            for index, size in b["frames"]:
                frames.append(decode_kv(geometry, payload[off:off + size], geometry.layers))
                indices.append(index)
                off += size
            kv = (np.concatenate(frames, axis=3) if frames
                  else decode_kv(geometry, b"", geometry.layers))
            out.append(FetchedBlock(info=info, layout=PayloadLayout.FRAME_MAJOR,
                                    layers=list(range(geometry.layers)), payload=payload,
                                    kv=kv, frame_indices=indices, frames=frames))
        return out

    def _fetch_routed(self, req, stream_id: str, timeout):
        """_fetch_chunks, following redirects."""
        for hop in range(self.max_redirects + 1):
            try:
                return self._fetch_chunks(req, stream_id, timeout)
            except KvmemError as err:
                if not (self._learn(stream_id, err) and hop < self.max_redirects):
                    raise
        raise AssertionError("unreachable")

    def _fetch_resuming(self, req, stream_id: str, timeout) -> list:
        """Every block of req, asked again for those not yet received while
        the server refuses the next one for room (fetch_blocks)."""
        got: list[dict] = []
        idle = 0
        while True:
            blocks, refused = self._fetch_routed(req, stream_id, timeout)
            if refused is None:
                return got + blocks
            sent = _blocks_sent_before_refusal(refused)
            if sent < 0 or sent > len(blocks) or sent >= len(req.block_ids):
                raise refused
            got += blocks[:sent]
            idle = 0 if sent else idle + 1
            if idle > 5:  # 20, 40, 80, 160, 320 ms without progress.
                raise refused
            left = list(req.block_ids)[sent:]
            rest = pb.FetchBlocksRequest()
            rest.CopyFrom(req)
            del rest.block_ids[:]
            rest.block_ids.extend(left)
            # Only the blocks still asked for may have token lists.
            del rest.tokens[:]
            wanted = set(left)
            rest.tokens.extend(t for t in req.tokens if t.block_id in wanted)
            req = rest
            if idle:
                time.sleep(0.01 * (1 << idle))

    def _fetch_chunks(self, req, stream_id: str, timeout):
        """One FetchBlocks call's chunks, gathered per block, and None; or
        the whole blocks received and the error when the server refused
        the next block for room (\"FetchBlocks sent N of M blocks\")."""
        blocks: list[dict] = []
        try:
            call = self._stub_for(stream_id).FetchBlocks(
                req, metadata=self.metadata(stream_id),
                timeout=self.timeout if timeout is None else timeout)
            for c in call:
                cur = blocks[-1] if blocks else None
                if c.HasField("block") and (cur is None or cur["id"] != c.block_id
                                            or cur["size"] > 0):
                    cur = {"id": c.block_id, "info": c.block, "parts": [], "size": 0,
                           "frames": []}
                    blocks.append(cur)
                if cur is None or cur["id"] != c.block_id or cur["size"] != c.offset:
                    call.cancel()
                    raise error_for(grpc.StatusCode.DATA_LOSS,
                                    "FetchBlocks chunks arrived out of order")
                cur["parts"].append(c.data)
                cur["size"] += len(c.data)
                fr = cur["frames"]
                if fr and fr[-1][0] == c.frame_index:
                    fr[-1][1] += len(c.data)
                else:
                    fr.append([c.frame_index, len(c.data)])
        except grpc.RpcError as e:
            err = error_from_rpc(e)
            if _blocks_sent_before_refusal(err) >= 0:
                return blocks, err
            raise err from None
        return blocks, None

    # -- shared memory ----------------------------------------------------

    def attach_shared_memory(self, nbytes: int = 0,
                             timeout: Optional[float] = None) -> None:
        """Attaches a shared-memory arena of nbytes (0: shm_arena_bytes,
        256 MiB, or the largest that fits when the server has no room for
        that); a unix-socket target on the server's host only
        (FailedPreconditionError otherwise). While one is attached, asking
        for no more than it holds does nothing and asking for more attaches
        a larger one in its place (deliveries in the old one stay valid).
        fetch_shared and shared-memory recalls attach on first use, and again
        after a server restart."""
        with self._lock:
            attached = self._arena
        if attached is not None and attached.size >= nbytes:
            return
        try:
            resp = self._call(self._stub.AttachSharedMemory,
                              pb.AttachSharedMemoryRequest(bytes=nbytes or self.shm_arena_bytes),
                              None, timeout)
        except KvmemError as e:
            # The default size is past what this caller may have (the
            # server's largest arena, or its share of the server's arenas
            # with many tenants): the largest that fits, or this refusal.
            sized = e.code in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                               grpc.StatusCode.INVALID_ARGUMENT) and (
                "--shm_max_arena_bytes" in e.message or
                "--shm_max_total_bytes" in e.message)
            if nbytes or not self.shm_arena_bytes or not sized:
                raise
            try:
                resp = self._call(self._stub.AttachSharedMemory,
                                  pb.AttachSharedMemoryRequest(bytes=0), None, timeout)
            except KvmemError:
                raise e from None
        arena = Arena(resp)
        with self._lock:
            if self._arena is attached:
                self._arena = arena

    @property
    def shm_arena_id(self) -> int:
        with self._lock:
            return self._arena.id if self._arena is not None else 0

    def _with_arena(self, fn):
        """fn(arena); once more on a new arena when the server no longer
        knows this one (it restarted)."""
        for attempt in range(2):
            self.attach_shared_memory()
            with self._lock:
                arena = self._arena
            try:
                return fn(arena)
            except KvmemError as e:
                if attempt or e.code != grpc.StatusCode.NOT_FOUND or \
                        "shared-memory arena" not in e.message:
                    raise
                with self._lock:
                    if self._arena is arena:
                        self._arena = None

    def _defer_release(self, arena: Arena, lease: int) -> None:
        with self._lock:
            self._deferred.append((arena.id, lease))

    def _defer_again(self, arena: Arena, leases: Sequence[int]) -> None:
        """Leases taken for a call that failed, deferred again: the server
        releases them before it runs a delivery, but a failed call may not
        have reached it (a lease released already is ignored there)."""
        with self._lock:
            self._deferred.extend((arena.id, lease) for lease in leases)

    def _take_deferred(self, arena: Arena) -> list[int]:
        """Leases of this arena to release with the next delivery (those of
        older arenas go with them)."""
        with self._lock:
            mine = [(a, lease) for a, lease in self._deferred if a == arena.id]
            # At most the server's limit a call; the rest wait for the next.
            ids = [lease for _, lease in mine[:_MAX_RELEASES_PER_CALL]]
            self._deferred = mine[_MAX_RELEASES_PER_CALL:]
        return ids

    def _release(self, arena: Arena, lease: int) -> None:
        try:
            resp = self._call(self._stub.ReleaseLeases,
                              pb.ReleaseLeasesRequest(arena_id=arena.id, lease_ids=[lease]),
                              None, None)
        except KvmemError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return  # The server restarted: nobody wrote our mapping since.
            raise
        if resp.expired:
            raise error_for(grpc.StatusCode.DATA_LOSS,
                            f"lease {lease} was reclaimed by the server (held past "
                            "lease_ms): its bytes may have been overwritten while read")

    def fetch_shared(self, stream_id: str, block_ids: Sequence[int], *,
                     layout: PayloadLayout = PayloadLayout.BLOCK_LAYER_MAJOR,
                     layers: Optional[Sequence[int]] = None,
                     tokens: Optional[Mapping[int, Sequence[int]]] = None,
                     timeout: Optional[float] = None) -> Delivery:
        """The blocks placed in this client's shared-memory arena by the
        server: read-only views (and kv arrays, BLOCK_LAYER_MAJOR and
        TOKEN_LAYER_MAJOR), no bytes through the socket. tokens: as
        fetch_blocks'. Release the Delivery when done."""
        geometry = self.geometry(stream_id)
        n_layers = len(layers) if layers else geometry.layers

        def fetch(arena: Arena) -> Delivery:
            req = pb.FetchBlocksRequest(stream_id=stream_id, block_ids=list(block_ids),
                                        layout=int(layout), layers=list(layers or []),
                                        tokens=_block_tokens(tokens),
                                        shm_arena_id=arena.id)
            # Taken once the request is built (building it may raise).
            released = self._take_deferred(arena)
            req.release_lease_ids.extend(released)
            try:
                msgs = list(self._stub.FetchBlocks(
                    req, metadata=self.metadata(stream_id),
                    timeout=self.timeout if timeout is None else timeout))
            except grpc.RpcError as e:
                self._defer_again(arena, released)
                raise error_from_rpc(e) from None
            named = dict(tokens or {})
            items = [(m.block_id, from_proto(RecalledBlock, m.block), m.shm, None,
                      _fetched_tokens(layout, named, m.block_id, m.block.token_count))
                     for m in msgs]
            blocks = block_views(arena, geometry, n_layers, layout in _LAYER_MAJOR,
                                 items)
            return Delivery(blocks=blocks, lease_id=msgs[0].shm.lease_id if msgs else 0,
                            nbytes=sum(len(b.data) for b in blocks),
                            _client=self, _arena=arena)

        return self._with_arena(fetch)

    def _delivering(self, req: "pb.RecallRequest", stream_id: str, mode: str,
                    layout: PayloadLayout, layers, held, held_tokens, exchange):
        """Runs a recall with delivery: exchange(req) -> pb.RecallResponse."""
        if mode not in ("shm", "inline"):
            raise ValueError(f"mode is {mode!r}; use 'shm' or 'inline'")
        d = req.delivery
        d.mode = (pb.RecallDelivery.MODE_SHARED_MEMORY if mode == "shm"
                  else pb.RecallDelivery.MODE_INLINE)
        d.layout = int(layout)
        d.layers.extend(list(layers or []))
        d.held_block_ids.extend(list(held))
        d.held_tokens.extend(_block_tokens(held_tokens))
        geometry = self.geometry(stream_id)
        n_layers = len(layers) if layers else geometry.layers

        def run(arena: Optional[Arena]):
            released = []
            if arena is not None:
                d.shm_arena_id = arena.id
                del d.release_lease_ids[:]
                released = self._take_deferred(arena)
                d.release_lease_ids.extend(released)
            try:
                resp = exchange(req)
            except Exception:
                if arena is not None:
                    self._defer_again(arena, released)
                raise
            token = layout == PayloadLayout.TOKEN_LAYER_MAJOR
            items = [(b.block_id, None, b.shm if b.HasField("shm") else None,
                      None if b.HasField("shm") else b.data,
                      list(b.token_offsets) if token else None)
                     for b in resp.delivered]
            blocks = block_views(arena, geometry, n_layers, layout in _LAYER_MAJOR,
                                 items)
            lease = resp.delivered[0].shm.lease_id if (arena is not None and
                                                       resp.delivered) else 0
            resp.ClearField("delivered")
            return (from_proto(RecallResponse, resp),
                    Delivery(blocks=blocks, lease_id=lease, nbytes=resp.delivered_bytes,
                             _client=self, _arena=arena))

        return self._with_arena(run) if mode == "shm" else run(None)

    def recall_delivered(self, stream_id: str, query, *, mode: str = "shm",
                         layout: PayloadLayout = PayloadLayout.BLOCK_LAYER_MAJOR,
                         layers: Optional[Sequence[int]] = None,
                         held: Sequence[int] = (),
                         held_tokens: Optional[Mapping[int, Sequence[int]]] = None,
                         timeout: Optional[float] = None,
                         **recall_args) -> tuple[RecallResponse, Delivery]:
        """recall() and the recalled blocks' bytes in the same exchange: mode
        "shm" (views into the shared-memory arena) or "inline". held: block
        ids this client holds already; they are left out (the response's
        held_blocks counts them). layout TOKEN_LAYER_MAJOR delivers only the
        recalled tokens (each SharedBlock's token_offsets says which);
        held_tokens (that layout only): block id -> token offsets held, left
        out. Release the Delivery when done."""
        req = _recall_request(stream_id, query, **_recall_defaults(recall_args))
        return self._delivering(
            req, stream_id, mode, layout, layers, held, held_tokens,
            # Shared memory is this host's server's: not redirected (a
            # refusal naming another owner raises with .owner set).
            lambda r: self._call(self._stub.Recall if mode == "shm" else "Recall",
                                 r, stream_id, timeout))

    # -- session ----------------------------------------------------------

    def session(self, stream_id: str, config: Optional[StreamConfig] = None,
                timeout: Optional[float] = None) -> "Session":
        """Starts a Session (the bidirectional live-camera call) bound to the
        stream, opening it with config when given, at the stream's owner
        (redirects followed). Use as a context manager."""
        for hop in range(self.max_redirects + 1):
            try:
                return Session(self, stream_id, config, timeout)
            except KvmemError as err:
                # _broken already learnt the owner; go again when it moved.
                if not (err.owner and err.owner == self.route(stream_id)
                        and hop < self.max_redirects):
                    raise
        raise AssertionError("unreachable")


_LAYER_MAJOR = (PayloadLayout.BLOCK_LAYER_MAJOR, PayloadLayout.TOKEN_LAYER_MAJOR)


def _block_tokens(tokens: Optional[Mapping[int, Sequence[int]]]) -> list:
    """{block id: token offsets} as BlockTokens messages."""
    return [pb.BlockTokens(block_id=int(b), token_offsets=[int(x) for x in t])
            for b, t in (tokens or {}).items()]


def _fetched_tokens(layout, named: dict, block_id: int, token_count: int):
    """The tokens a TOKEN_LAYER_MAJOR fetch of the block holds; else None."""
    if layout != PayloadLayout.TOKEN_LAYER_MAJOR:
        return None
    t = named.get(block_id)
    return list(range(token_count)) if t is None or len(t) == 0 else [int(x) for x in t]


def _recall_defaults(args: dict) -> dict:
    """recall()'s keyword arguments with their defaults, for _recall_request."""
    out = dict(top_k=0, max_tokens=0, window_fraction=0.0, current_token_position=0,
               signals=None, per_layer=False, priority=0, window_lse=None,
               per_head=False, identity_share=None, mass_target=0.0)
    unknown = set(args) - set(out)
    if unknown:
        raise TypeError(f"unknown recall arguments: {sorted(unknown)}")
    out.update(args)
    return out


def _header(f: Frame, tokens: int, cursor: _Cursor) -> "types_pb.FrameHeader":
    """The frame's header; advances the cursor past it."""
    index = cursor.frame if f.frame_index is None else f.frame_index
    pos = cursor.position if f.first_token_position is None else f.first_token_position
    h = types_pb.FrameHeader(frame_index=index, timestamp_us=f.timestamp_us,
                             first_token_position=pos, token_count=tokens)
    if f.signals is not None:
        to_proto(f.signals, h.signals)
    cursor.frame = index + 1
    cursor.position = pos + tokens
    return h


class Session:
    """One Session call: appends and recalls on one stream, each waiting for
    its response (so responses never need reordering). Not thread-safe.

    opened holds the OpenStreamResponse. A rejected recall raises and leaves
    the session usable; an append error ends the call (the exception's
    last_durable_frame says where to resume, with a new session).
    """

    def __init__(self, client: Client, stream_id: str,
                 config: Optional[StreamConfig], timeout: Optional[float]) -> None:
        self._client = client
        self.stream_id = stream_id
        self._requests: "queue.SimpleQueue[Optional[pb.SessionRequest]]" = queue.SimpleQueue()
        self._seq = 0
        self._finished = False
        self._responses = client._stub_for(stream_id).Session(
            self._generate(), metadata=client.metadata(stream_id), timeout=timeout)
        req = pb.SessionRequest(open=pb.OpenStreamRequest(stream_id=stream_id))
        if config is not None:
            to_proto(config, req.open.config)
        try:
            resp = self._exchange(req, wait=True)
        except BaseException:
            self.cancel()
            raise
        self.opened = from_proto(OpenStreamResponse, resp.opened)
        client._remember(self.opened.stats)
        self._geometry = self.opened.stats.config.geometry
        self._cursor = _Cursor(self.opened.stats.last_durable_frame + 1,
                               self.opened.stats.next_token_position)

    def _generate(self) -> Iterator["pb.SessionRequest"]:
        while True:
            req = self._requests.get()
            if req is None:
                return
            yield req

    def _broken(self, e: Optional[grpc.RpcError]) -> KvmemError:
        self._finished = True
        self._requests.put(None)
        if e is not None:
            err = error_from_rpc(e)
            self._client._learn(self.stream_id, err)
            return err
        return error_for(grpc.StatusCode.UNAVAILABLE, "the session ended unexpectedly")

    def _exchange(self, req: "pb.SessionRequest", wait: bool) -> Optional["pb.SessionResponse"]:
        if self._finished:
            raise error_for(grpc.StatusCode.FAILED_PRECONDITION, "the session is finished")
        self._seq += 1
        req.seq = self._seq
        self._requests.put(req)
        if not wait:
            return None
        try:
            resp = next(self._responses)
        except StopIteration:
            raise self._broken(None) from None
        except grpc.RpcError as e:
            raise self._broken(e) from None
        if resp.seq != self._seq:
            raise self._broken_with(grpc.StatusCode.INTERNAL, "session response out of order")
        if resp.HasField("error"):
            err = error_from_code_value(resp.error.code, resp.error.message,
                                        resp.error.owner)
            self._client._learn(self.stream_id, err)
            raise err
        return resp

    def _broken_with(self, code: grpc.StatusCode, message: str) -> KvmemError:
        self.cancel()
        return error_for(code, message)

    def append(self, frame: FrameLike) -> AppendAck:
        """Appends one frame (chunked like Client.append_frames); its ack."""
        f = _as_frame(frame)
        tokens, payload = encode_frame(self._geometry, f.kv)
        cursor = _Cursor(self._cursor.frame, self._cursor.position)
        header = _header(f, tokens, cursor)
        msgs = list(_frame_messages(header, payload, self._client.chunk_bytes))
        resp = None
        for i, (kind, msg) in enumerate(msgs):
            # Only the message completing the frame gets a response.
            resp = self._exchange(pb.SessionRequest(**{kind: msg}), wait=i == len(msgs) - 1)
        if resp is None or not resp.HasField("ack"):
            raise self._broken_with(grpc.StatusCode.INTERNAL,
                                    "session answered a frame without an ack")
        self._cursor = cursor
        self._client._forget_cursor(self.stream_id)
        return from_proto(AppendAck, resp.ack)

    def recall(self, query, *, top_k: int = 0, max_tokens: int = 0,
               window_fraction: float = 0.0, current_token_position: int = 0,
               signals: Optional[FrameSignals] = None, per_layer: bool = False,
               priority: int = 0, window_lse=None,
               per_head: bool = False, identity_share: Optional[float] = None,
               mass_target: float = 0.0) -> RecallResponse:
        """Client.recall over the session."""
        req = _recall_request("", query, top_k=top_k, max_tokens=max_tokens,
                              window_fraction=window_fraction,
                              current_token_position=current_token_position,
                              signals=signals, per_layer=per_layer, priority=priority,
                              window_lse=window_lse, per_head=per_head,
                              identity_share=identity_share,
                              mass_target=mass_target)
        resp = self._exchange(pb.SessionRequest(recall=req), wait=True)
        return from_proto(RecallResponse, resp.recall)

    def recall_delivered(self, query, *, mode: str = "shm",
                         layout: PayloadLayout = PayloadLayout.BLOCK_LAYER_MAJOR,
                         layers: Optional[Sequence[int]] = None,
                         held: Sequence[int] = (),
                         held_tokens: Optional[Mapping[int, Sequence[int]]] = None,
                         **recall_args) -> tuple[RecallResponse, Delivery]:
        """Client.recall_delivered over the session (the arena is the
        client's)."""
        req = _recall_request("", query, **_recall_defaults(recall_args))
        return self._client._delivering(
            req, self.stream_id, mode, layout, layers, held, held_tokens,
            lambda r: self._exchange(pb.SessionRequest(recall=r), wait=True).recall)

    def close(self) -> None:
        """Half-closes the call and waits for its final status (raises if it
        is an error)."""
        if self._finished:
            return
        self._finished = True
        self._requests.put(None)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None

    def cancel(self) -> None:
        """Ends the call without waiting."""
        self._finished = True
        self._requests.put(None)
        self._responses.cancel()

    def __del__(self) -> None:
        # An abandoned session: end the call and free gRPC's request thread.
        if not getattr(self, "_finished", True):
            try:
                self.cancel()
            except Exception:
                pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()


def connect(target: str, **kwargs) -> Client:
    """Client(target, **kwargs)."""
    return Client(target, **kwargs)
