"""The typed requests of the local RPC: one model per worker handler, its reply type its parameter.

A worker's RPC surface is its ``@rpc`` handlers (``rpc_server.py``); the node side names each of
them by a ``Request`` subclass, never by a string: ``DhtClient.info`` sends ``dht_rpc.Info()``
and gets a ``DhtInfo`` back. A request's fields are the handler's keyword arguments (same
names, types and defaults: ``tests/test_net_rpc_api.py`` checks every handler against its
request), its class name in snake case the handler's name (``FetchAnchor`` -> ``fetch_anchor``),
and ``Request[R]``'s ``R`` the type the reply is validated as. On the wire nothing changed: the
request is ``{"method": rpc_method, "params": rpc_params()}`` (``ipc.py``), so both ends stay
compatible. Errors still cross as data (``ipc.raised_error``); a reply that is not an ``R`` is a
``WireError``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar, cast

import pydantic

from pulse_node.errors import WireError

R = TypeVar("R")


class Request(pydantic.BaseModel, Generic[R]):
    """One call of a worker handler; ``R``: what it returns."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    rpc_method: ClassVar[str] = ""  # the handler's name (empty on a generic base)
    rpc_reply_type: ClassVar[object] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: object) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        meta = cls.__pydantic_generic_metadata__
        if meta["origin"] is not None or meta["parameters"]:
            return  # ``Request[X]`` itself, or a generic base of a worker's requests
        cls.rpc_method = _snake(cls.__name__)
        cls.rpc_reply_type = next((b.__pydantic_generic_metadata__["args"][0] for b in cls.__mro__
                               if issubclass(b, Request) and b.__pydantic_generic_metadata__["args"]), object)

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _bad_params_are_wire_errors(cls, data: object, handler: pydantic.ModelWrapValidatorHandler[Request[R]]
                                    ) -> Request[R]:
        """A request that is not what its handler takes fails as the worker would fail it, before it is sent."""
        try:
            return handler(data)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "params"
            raise WireError(f"{cls.rpc_method}: bad params: {where}: {first['msg']}") from None

    def rpc_params(self) -> dict[str, object]:
        """The handler's keyword arguments, as msgpack-able data."""
        return self.model_dump()

    def rpc_reply(self, result: object) -> R:
        """The worker's ``result`` validated as this request's reply type."""
        try:
            value = cast(R, _adapter(self.rpc_reply_type).validate_python(result))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "result"
            raise WireError(f"{self.rpc_method}: bad reply: {where}: {first['msg']}") from None
        return value


@functools.cache
def _adapter(reply_type: object) -> pydantic.TypeAdapter[object]:
    return pydantic.TypeAdapter(cast("type[object]", reply_type))


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass(frozen=True)
class Pushed:
    """Either worker's answer to a push: the peer queued ``bytes`` bytes, ``seconds`` after the call."""

    bytes: int
    seconds: float


class Ping(Request[list[str]]):
    """Every worker: the names of its handlers (answered once it serves)."""


class Stop(Request[bool]):
    """Every worker: stop after this reply."""
