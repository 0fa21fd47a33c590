"""metergate: clients for metergate's admission, customer and admin APIs (sdk/python/README.md).

The models of every request and reply are metergate.models, generated from admit's OpenAPI
document (scripts/generate.sh)."""

from . import models
from ._client import Admission, AsyncClient, Client, Retry
from .errors import (BadRequest, Conflict, Forbidden, MetergateError, NotFound, PaymentRequired, RateLimited,
                     Unauthorized, Unavailable)

__all__ = ["Admission", "AsyncClient", "BadRequest", "Client", "Conflict", "Forbidden", "MetergateError", "NotFound",
           "PaymentRequired", "RateLimited", "Retry", "Unauthorized", "Unavailable", "models"]
