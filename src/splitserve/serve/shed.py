"""A full server's 429, written by the HTTP protocol as the request is read.

Under overload the event loop runs bursts of streaming work (a token worker's step wakes every
stream it carries); an ASGI task started for a request waits behind the callbacks already queued,
so a refusal made in the handler (completions.py) waited up to tens of milliseconds for its turn
(benchmarks/serve/README.md, "Shedding under overload"). `shedding_protocol` makes uvicorn's
httptools protocol ask `refusal(path, headers)` once a POST's headers are read: given an answer, it
reads the body past (unparsed), writes the answer as the request ends, in the same I/O callback,
and keeps the connection for the next request, with no ASGI task at all. A request whose answer
is not a refusal, one with `Expect: 100-continue`, or one behind a response still being written
on its connection, takes the usual path.

It relies on uvicorn's HttpToolsProtocol (its parser callbacks, `cycle`, `url`, `headers` and
`on_response_complete`): tests/serve/test_overload.py checks it on the installed uvicorn, and
`run_server` takes it only where httptools is the parser.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)
HOOKS = ("on_headers_complete", "on_body", "on_message_complete", "on_response_complete")

Refusal = Callable[[bytes, list[tuple[bytes, bytes]]], "bytes | None"]   # (path, headers) -> an answer


def shedding_protocol(refusal: Refusal) -> type[HttpToolsProtocol] | str:
    """uvicorn's httptools protocol, answering what `refusal` refuses itself (the docstring); plain
    "httptools" where this uvicorn's protocol lacks a hook it needs. Should a later uvicorn lack an
    attribute it reads, it logs that once and leaves every request to uvicorn."""
    missing = [h for h in HOOKS if not callable(getattr(HttpToolsProtocol, h, None))]
    if missing:
        logger.warning("this uvicorn's httptools protocol lacks %s: 429s are written by the handler",
                       ", ".join(missing))
        return "httptools"

    class Shedding(HttpToolsProtocol):
        shed: bytes | None = None  # the answer of the request being read, when it is refused here
        works = True               # False once an attribute it reads was missing (a newer uvicorn)

        def on_headers_complete(self) -> None:
            if Shedding.works:
                try:
                    cycle = self.cycle
                    if ((cycle is None or cycle.response_complete) and not self.expect_100_continue
                            and self.parser.get_method() == b"POST"):
                        self.shed = refusal(httptools.parse_url(self.url).path, self.headers)
                except AttributeError as e:
                    Shedding.works = False
                    logger.warning("shedding in the HTTP protocol is off (%s): 429s are written by the handler", e)
                if self.shed is not None:
                    return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self.shed is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self.shed is None:
                super().on_message_complete()
                return
            answer, self.shed = self.shed, None
            self.transport.write(answer)
            if not self.parser.should_keep_alive():
                self.transport.close()
            self.on_response_complete()

    return Shedding
