"""metergate: clients for metergate's admission, customer and admin APIs (sdk/python/README.md)."""

from ._client import Admission, AsyncClient, Client, Retry
from .errors import Forbidden, MetergateError, PaymentRequired, RateLimited, Unauthorized, Unavailable

__all__ = ["Admission", "AsyncClient", "Client", "Forbidden", "MetergateError", "PaymentRequired", "RateLimited",
           "Retry", "Unauthorized", "Unavailable"]
