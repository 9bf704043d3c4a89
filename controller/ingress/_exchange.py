"""One request's way through a replica once its head is sent: the body up, then the answer
down, chunk by chunk, while a watcher notices a client that hangs up (which cancels it all:
the replica sees its connection close). The replica's answer time is recorded, for the choice
of replicas."""

from __future__ import annotations

from typing import final

import attrs
import h11
import trio

from ._config import IngressConfig
from ._errors import ClientGone, Reply
from ._table import BackendRoutes, Slot
from ._upstream import Upstream

READ_SIZE = 65536
#: Not passed on: they describe one hop, not the message (RFC 9110 7.6.1); h11 frames each
#: side itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authorization",
        b"expect",
    }
)


@final
@attrs.define(eq=False)
class Exchange:
    """A request from the client on `stream` (spoken through `conn`) whose head went to the
    replica of `slot` on `upstream`."""

    stream: trio.SocketStream
    conn: h11.Connection
    upstream: Upstream
    backend: BackendRoutes
    slot: Slot
    config: IngressConfig

    async def run(self) -> int:
        """Relay the rest; the status the replica answered. Raises `Reply` for an answer of
        the ingress's own (when nothing of the replica's was sent yet), and `ClientGone`."""
        await self._send_body()
        failed: Exception | None = None
        status = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_hangup, nursery.cancel_scope)
            # Caught here and raised below: out of a nursery it would come wrapped in a group.
            try:
                status = await self._send_answer()
            except (Reply, ClientGone) as exc:
                failed = exc
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                failed = ClientGone()
            nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed
        if status == 0:
            raise ClientGone  # the watcher cut the answer short: the client hung up
        # A client that hangs up once it has the whole answer is no failure.
        return status

    async def _send_body(self) -> None:
        conn, timeout = self.conn, self.config.body_timeout_s
        if conn.they_are_waiting_for_100_continue:
            go_on = h11.InformationalResponse(status_code=100, headers=[])
            await self.stream.send_all(conn.send(go_on) or b"")
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise Reply(400, "BadRequest", f"malformed request body: {exc}") from None
            if event is h11.NEED_DATA:
                with trio.move_on_after(timeout) as waited:
                    data = await self.stream.receive_some(READ_SIZE)
                if waited.cancelled_caught:
                    raise Reply(
                        408, "RequestTimeout", f"the request body stalled for {timeout:g} s"
                    )
                if not data:
                    raise ClientGone
                conn.receive_data(data)
            elif isinstance(event, h11.Data):
                await self._up(event)
            elif isinstance(event, h11.EndOfMessage):
                await self._up(h11.EndOfMessage())
                return
            else:
                raise ClientGone  # closed mid-body

    async def _up(self, event: h11.Event) -> None:
        data = self.upstream.conn.send(event)
        if not data:
            return  # the end of a request without a body: nothing goes out, nothing can stall
        if isinstance(event, h11.Data):
            self.upstream.body_sent = True
        address, timeout = self.upstream.address, self.config.body_timeout_s
        with trio.move_on_after(timeout) as waited:
            try:
                await self.upstream.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                message = (
                    f"the replica at {address} closed the connection while the request was "
                    f"sent: {exc}"
                )
                raise Reply(502, "BadGateway", message) from None
        if waited.cancelled_caught:
            message = f"the replica at {address} stopped reading the request for {timeout:g} s"
            raise Reply(502, "BadGateway", message)

    async def _send_answer(self) -> int:
        timeout, address = self.config.request_timeout_s, self.upstream.address
        sent = trio.current_time()
        with trio.move_on_after(timeout) as waited:
            response = await self._from_replica()
            while isinstance(response, h11.InformationalResponse):
                response = await self._from_replica()  # 1xx: not passed on
        self.backend.answered(self.slot, trio.current_time() - sent)  # a timeout counts
        if waited.cancelled_caught:
            message = (
                f"backend {self.backend.name!r}: the replica at {address} did not answer "
                f"within request_timeout_s={timeout:g}"
            )
            raise Reply(504, "GatewayTimeout", message)
        if not isinstance(response, h11.Response):
            message = f"the replica at {address} closed the connection without answering"
            raise Reply(502, "BadGateway", message)
        headers = [(k, v) for k, v in response.headers if k not in HOP_BY_HOP]
        code = response.status_code
        head = h11.Response(status_code=code, headers=headers, reason=response.reason)
        out = bytearray(self.conn.send(head) or b"")
        # From here on the client gets the head: a failure can only cut the answer short. What
        # the replica has sent already goes with it, in one write: a small answer is one.
        while True:
            done = self._take_buffered(out)
            await self._to_client(out)
            if done:
                return code
            with trio.move_on_after(timeout) as waited:
                event = await self._from_replica()
            if waited.cancelled_caught:
                raise ClientGone  # its connection is closed: it sees a broken answer
            out = bytearray()
            if self._pass_on(event, out):
                await self._to_client(out)
                return code

    def _take_buffered(self, out: bytearray) -> bool:
        """Add to `out` the events of the answer h11 holds already (no waiting); whether the
        answer ended among them."""
        while True:
            try:
                event = self.upstream.conn.next_event()
            except h11.ProtocolError:
                raise ClientGone from None
            if event is h11.NEED_DATA:
                return False
            assert not isinstance(event, type)  # PAUSED is not possible for a client here
            if self._pass_on(event, out):
                return True

    def _pass_on(self, event: h11.Event, out: bytearray) -> bool:
        """Add the bytes of one event of the answer to `out`; whether it was the answer's end."""
        if isinstance(event, h11.Data):
            out += self.conn.send(h11.Data(data=event.data)) or b""
            return False
        if isinstance(event, h11.EndOfMessage):
            out += self.conn.send(h11.EndOfMessage()) or b""
            return True
        raise ClientGone  # the replica closed mid-answer: the client sees a broken answer

    async def _from_replica(self) -> h11.Event:
        try:
            return await self.upstream.next_event()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError):
            return h11.ConnectionClosed()

    async def _to_client(self, data: bytes | bytearray) -> None:
        if not data:
            return
        with trio.move_on_after(self.config.body_timeout_s) as waited:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise ClientGone from None
        if waited.cancelled_caught:
            raise ClientGone  # it stopped reading: the replica's slot is not held for it

    async def _watch_hangup(self, scope: trio.CancelScope) -> None:
        """Cancel `scope` if the client hangs up while its answer is awaited or sent. What it
        sends meanwhile (its next requests, pipelined) is kept for later, up to a bound: a
        client that sends more than that is watched no more."""
        held = 0
        while held <= 4 * self.config.max_header_bytes:
            try:
                data = await self.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                scope.cancel()
                return
            self.conn.receive_data(data)
            held += len(data)
