"""The service's errors: a request that cannot be served (the client's to change,
reported to it with category ``user``) and the HTTP status that carries it."""

from __future__ import annotations


class UserError(ValueError):
    """A request this server cannot serve; the message says what to change."""

    status = 400


class NotFound(UserError):
    """A session, model, sampler, future or checkpoint this server does not hold."""

    status = 404
