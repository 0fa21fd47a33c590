"""Every operation of admit's API (internal/api/openapi.yaml), declared once for Client and
AsyncClient (_operation.py): the service API on the client itself, the admin API on
client.admin, the customer API on client.portal. A method is named for its operationId in
snake case, without the portal prefix on client.portal (portalGetAccount is
client.portal.get_account); tests/test_api.py fails when one is missing or disagrees with
the document. A body is its generated model or a mapping of JSON values."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cached_property
from typing import Any, Literal, Mapping

import httpx

from . import models as m
from ._operation import JSON, Call, Namespace, R, operation

Rendering = Literal["pdf", "html", "csv"]


@dataclass(frozen=True)
class Admission:
    """An admitted request: its event id (report its outcome with it) and the reply."""

    event_id: str
    account: str
    org: str
    period: str
    replayed: bool
    reply: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=httpx.Headers)
    """The reply's headers (RateLimit, RateLimit-Policy, Idempotent-Replayed), any case."""

    @cached_property
    def allowed(self) -> m.AdmitAllowed:
        """The reply as its model (decoded on first use: admitting stays cheap)."""
        return m.AdmitAllowed.model_validate(self.reply)

    @classmethod
    def of(cls, reply: dict[str, Any], headers: Mapping[str, str]) -> Admission:
        """The admission of a 200 reply of POST /v1/admit."""
        return cls(event_id=str(reply["event_id"]), account=str(reply.get("account", "")),
                   org=str(reply.get("org", "")), period=str(reply.get("period", "")),
                   replayed=bool(reply.get("replayed", False)), reply=reply, headers=headers)


def _admit_body(account: str | None, api_key: str | None, units: Mapping[str, int] | None,
                idempotency_key: str | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    if (account is None) == (api_key is None):
        raise ValueError("give exactly one of account and api_key")
    body: dict[str, Any] = {"idempotency_key": idempotency_key or uuid.uuid4().hex}
    if account is not None:
        body["account"] = account
    else:
        body["api_key"] = api_key
    if units:
        body["units"] = dict(units)
    body.update(extra)
    return body


def _with_key(body: m.GrantCreate | JSON) -> dict[str, Any]:
    """A grant's body with an idempotency key, made when it has none: every retry of the
    call sends the same one, so a retry never grants twice."""
    d = body.model_dump(mode="json", by_alias=True, exclude_unset=True) if isinstance(body, m.GrantCreate) else dict(body)
    d.setdefault("idempotency_key", uuid.uuid4().hex)
    return d


class Service(Namespace[R]):
    """The service API (the service token): admission, outcomes, estimates, usage."""

    @operation("admit", "POST", "/v1/admit")
    def admit(self, /, *, account: str | None = None, api_key: str | None = None, units: Mapping[str, int] | None = None,
              idempotency_key: str | None = None, **extra: Any) -> Call[Admission]:
        """Asks admit to admit one request (POST /v1/admit), by account or by the end
        customer's API key; extra fields (tool, estimate, max_wait_ms) go in the body as
        given. One idempotency key per call, made when not given, is sent on every retry:
        a retry is never charged twice. Raises RateLimited (429), PaymentRequired (402),
        Unauthorized, Forbidden, or Unavailable once the retries are spent."""
        return Call(Admission, body=_admit_body(account, api_key, units, idempotency_key, extra), retry=True)

    @operation("outcome", "POST", "/v1/outcomes")
    def outcome(self, event_id: str, status: int, units: Mapping[str, int] | None = None) -> Call[m.OutcomeReply]:
        """Reports how an admitted request ended upstream: its status and its actual units
        (tokens). Retried like admit: an event's outcome is recorded once."""
        body: dict[str, Any] = {"event_id": event_id, "status": status}
        if units:
            body["units"] = dict(units)
        return Call(m.OutcomeReply, body=body, retry=True)

    @operation("estimate", "POST", "/v1/estimate")
    def estimate(self, body: m.EstimateRequest | JSON) -> Call[m.Estimate]:
        """The tokens POST /v1/admit would charge for an OpenAI or Anthropic request body;
        nothing is charged."""
        return Call(m.Estimate, body=body, retry=True)

    @operation("usage", "GET", "/v1/usage/{account}")
    def usage(self, account: str) -> Call[m.UsageReply]:
        """Quota usage of an account in the current period."""
        return Call(m.UsageReply, path={"account": account})

    @operation("balance", "GET", "/v1/balance/{account}")
    def balance(self, account: str) -> Call[m.BalanceReply]:
        """Prepaid credit balances of an account, with the ledger beside them."""
        return Call(m.BalanceReply, path={"account": account})

    @operation("openapi", "GET", "/openapi.yaml")
    def openapi(self) -> Call[bytes]:
        """The OpenAPI document admit serves, as YAML bytes."""
        return Call(bytes)


class Admin(Namespace[R]):
    """The admin API (the admin token, or a staff member's): accounts, keys, plans,
    alerts, grants, webhooks, invoices, staff, customer tokens."""

    @operation("createAccount", "POST", "/v1/admin/accounts")
    def create_account(self, body: m.AccountCreate | JSON) -> Call[m.AccountReply]:
        """Creates an account node (an org, or a team, user or agent under a parent)."""
        return Call(m.AccountReply, body=body)

    @operation("getAccount", "GET", "/v1/admin/accounts/{id}")
    def get_account(self, id: str) -> Call[m.AccountReply]:
        """An account as stored, with its effective policy."""
        return Call(m.AccountReply, path={"id": id})

    @operation("updateAccount", "PUT", "/v1/admin/accounts/{id}")
    def update_account(self, id: str, body: m.AccountUpdate | JSON) -> Call[m.AccountReply]:
        """Replaces an account's plan, limits, concurrency and priority."""
        return Call(m.AccountReply, path={"id": id}, body=body)

    @operation("createGrant", "POST", "/v1/admin/accounts/{id}/grants")
    def create_grant(self, id: str, body: m.GrantCreate | JSON) -> Call[m.Grant]:
        """Grants an account prepaid units; an idempotency key is made when the body has
        none, and retries send it."""
        return Call(m.Grant, path={"id": id}, body=_with_key(body), retry=True)

    @operation("voidGrant", "DELETE", "/v1/admin/accounts/{id}/grants/{grant}")
    def void_grant(self, id: str, grant: str) -> Call[m.VoidGrantResponse]:
        """Voids a grant; what remains of it leaves the balance at once."""
        return Call(m.VoidGrantResponse, path={"id": id, "grant": grant})

    @operation("createAlert", "POST", "/v1/admin/alerts")
    def create_alert(self, body: m.AlertCreate | JSON) -> Call[m.AlertRule]:
        """Adds an alert rule to an account, or a default to a plan."""
        return Call(m.AlertRule, body=body)

    @operation("listAlerts", "GET", "/v1/admin/alerts")
    def list_alerts(self, *, account: str | None = None, plan: str | None = None) -> Call[m.ListAlertsResponse]:
        """Alert rules, of an account or a plan or all, oldest first."""
        return Call(m.ListAlertsResponse, query={"account": account, "plan": plan})

    @operation("getAlert", "GET", "/v1/admin/alerts/{id}")
    def get_alert(self, id: str) -> Call[m.AlertRule]:
        """One alert rule."""
        return Call(m.AlertRule, path={"id": id})

    @operation("updateAlert", "PUT", "/v1/admin/alerts/{id}")
    def update_alert(self, id: str, body: m.AlertUpdate | JSON) -> Call[m.AlertRule]:
        """Changes a rule's kind, unit, period and thresholds."""
        return Call(m.AlertRule, path={"id": id}, body=body)

    @operation("deleteAlert", "DELETE", "/v1/admin/alerts/{id}")
    def delete_alert(self, id: str) -> Call[None]:
        """Removes a rule; the alerts it fired stay recorded."""
        return Call(type(None), path={"id": id})

    @operation("createAPIKey", "POST", "/v1/admin/api-keys")
    def create_api_key(self, account: str) -> Call[m.APIKeyReply]:
        """Issues an API key for an account; the key is in this reply only."""
        return Call(m.APIKeyReply, body={"account": account})

    @operation("revokeAPIKey", "DELETE", "/v1/admin/api-keys/{id}")
    def revoke_api_key(self, id: str) -> Call[None]:
        """Revokes an API key; requests with it get 403 within a second."""
        return Call(type(None), path={"id": id})

    @operation("createPlan", "POST", "/v1/admin/plans")
    def create_plan(self, body: m.PlanCreate | JSON) -> Call[m.PlanReply]:
        """Creates a plan, optionally with its first price."""
        return Call(m.PlanReply, body=body)

    @operation("listPlans", "GET", "/v1/admin/plans")
    def list_plans(self) -> Call[m.ListPlansResponse]:
        """Every plan, smallest first, with its limits and price versions."""
        return Call(m.ListPlansResponse)

    @operation("getPlan", "GET", "/v1/admin/plans/{id}")
    def get_plan(self, id: str) -> Call[m.PlanReply]:
        """A plan with its limits and every version of its price."""
        return Call(m.PlanReply, path={"id": id})

    @operation("updatePlan", "PUT", "/v1/admin/plans/{id}")
    def update_plan(self, id: str, body: m.PlanUpdate | JSON) -> Call[m.PlanReply]:
        """Replaces a plan's rank, limits, concurrency and priority; a price adds a version."""
        return Call(m.PlanReply, path={"id": id}, body=body)

    @operation("createWebhook", "POST", "/v1/admin/webhooks")
    def create_webhook(self, body: m.WebhookWrite | JSON) -> Call[m.WebhookWithSecret]:
        """Adds a webhook endpoint; its secret is in this reply only."""
        return Call(m.WebhookWithSecret, body=body)

    @operation("listWebhooks", "GET", "/v1/admin/webhooks")
    def list_webhooks(self) -> Call[m.ListWebhooksResponse]:
        """Webhook endpoints, oldest first, without their secrets."""
        return Call(m.ListWebhooksResponse)

    @operation("getWebhook", "GET", "/v1/admin/webhooks/{id}")
    def get_webhook(self, id: str) -> Call[m.Webhook]:
        """A webhook endpoint, without its secret."""
        return Call(m.Webhook, path={"id": id})

    @operation("updateWebhook", "PUT", "/v1/admin/webhooks/{id}")
    def update_webhook(self, id: str, body: m.WebhookWrite | JSON) -> Call[m.Webhook]:
        """Replaces an endpoint's URL, types and account filter; enables or disables it."""
        return Call(m.Webhook, path={"id": id}, body=body)

    @operation("deleteWebhook", "DELETE", "/v1/admin/webhooks/{id}")
    def delete_webhook(self, id: str) -> Call[None]:
        """Deletes an endpoint with its secrets, deliveries and their log."""
        return Call(type(None), path={"id": id})

    @operation("rotateWebhook", "POST", "/v1/admin/webhooks/{id}/rotate")
    def rotate_webhook(self, id: str, *, overlap_s: int | None = None) -> Call[m.WebhookWithSecret]:
        """Gives an endpoint a new secret; the old one keeps signing for overlap_s."""
        return Call(m.WebhookWithSecret, path={"id": id}, body={} if overlap_s is None else {"overlap_s": overlap_s})

    @operation("listWebhookDeliveries", "GET", "/v1/admin/webhooks/{id}/deliveries")
    def list_webhook_deliveries(self, id: str, *, status: str | None = None,
                                limit: int | None = None) -> Call[m.ListWebhookDeliveriesResponse]:
        """An endpoint's latest deliveries, newest first."""
        return Call(m.ListWebhookDeliveriesResponse, path={"id": id}, query={"status": status, "limit": limit})

    @operation("getWebhookDelivery", "GET", "/v1/admin/webhooks/{id}/deliveries/{delivery}")
    def get_webhook_delivery(self, id: str, delivery: int) -> Call[m.WebhookDelivery]:
        """A delivery with the log of its attempts."""
        return Call(m.WebhookDelivery, path={"id": id, "delivery": delivery})

    @operation("replayWebhookDelivery", "POST", "/v1/admin/webhooks/{id}/deliveries/{delivery}/replay")
    def replay_webhook_delivery(self, id: str, delivery: int) -> Call[m.WebhookDelivery]:
        """Sends a delivery again, with the same webhook-id."""
        return Call(m.WebhookDelivery, path={"id": id, "delivery": delivery})

    @operation("replayWebhook", "POST", "/v1/admin/webhooks/{id}/replay")
    def replay_webhook(self, id: str, *, from_: datetime, to: datetime) -> Call[m.ReplayWebhookResponse]:
        """Sends an endpoint every event of [from_, to) it matches."""
        return Call(m.ReplayWebhookResponse, path={"id": id}, body={"from": from_, "to": to})

    @operation("listInvoices", "GET", "/v1/admin/invoices")
    def list_invoices(self, *, org: str | None = None, period: str | None = None, status: str | None = None,
                      after: int | None = None, limit: int | None = None) -> Call[m.ListInvoicesResponse]:
        """Issued invoices, oldest first, without their lines; a page of limit."""
        return Call(m.ListInvoicesResponse,
                    query={"org": org, "period": period, "status": status, "after": after, "limit": limit})

    @operation("getInvoice", "GET", "/v1/admin/invoices/{id}")
    def get_invoice(self, id: int | str) -> Call[m.InvoiceRecord]:
        """An invoice with its lines, status history and credit notes."""
        return Call(m.InvoiceRecord, path={"id": id})

    @operation("getInvoice", "GET", "/v1/admin/invoices/{id}")
    def get_invoice_file(self, id: int | str, rendering: Rendering) -> Call[bytes]:
        """An invoice rendered: its PDF, HTML page or CSV lines."""
        return Call(bytes, path={"id": f"{id}.{rendering}"})

    @operation("setInvoiceStatus", "POST", "/v1/admin/invoices/{id}/status")
    def set_invoice_status(self, id: int | str, *, status: str, reason: str) -> Call[m.SetInvoiceStatusResponse]:
        """Marks an invoice paid or uncollectible, with a reason."""
        return Call(m.SetInvoiceStatusResponse, path={"id": id}, body={"status": status, "reason": reason})

    @operation("voidInvoice", "POST", "/v1/admin/invoices/{id}/void")
    def void_invoice(self, id: int | str, *, reason: str) -> Call[m.VoidInvoiceResponse]:
        """Voids an invoice, with a reason, and issues its credit note."""
        return Call(m.VoidInvoiceResponse, path={"id": id}, body={"reason": reason})

    @operation("reissueInvoice", "POST", "/v1/admin/invoices/{id}/reissue")
    def reissue_invoice(self, id: int | str, *, reason: str) -> Call[m.ReissueInvoiceResponse]:
        """Reissues a voided invoice, with a reason."""
        return Call(m.ReissueInvoiceResponse, path={"id": id}, body={"reason": reason})

    @operation("listCreditNotes", "GET", "/v1/admin/credit-notes")
    def list_credit_notes(self, *, org: str | None = None, after: int | None = None,
                          limit: int | None = None) -> Call[m.ListCreditNotesResponse]:
        """Credit notes, oldest first, without their lines; a page of limit."""
        return Call(m.ListCreditNotesResponse, query={"org": org, "after": after, "limit": limit})

    @operation("getCreditNote", "GET", "/v1/admin/credit-notes/{id}")
    def get_credit_note(self, id: int | str) -> Call[m.CreditNote]:
        """A credit note with its lines."""
        return Call(m.CreditNote, path={"id": id})

    @operation("getCreditNote", "GET", "/v1/admin/credit-notes/{id}")
    def get_credit_note_file(self, id: int | str, rendering: Rendering) -> Call[bytes]:
        """A credit note rendered: its PDF, HTML page or CSV lines."""
        return Call(bytes, path={"id": f"{id}.{rendering}"})

    @operation("amend", "POST", "/v1/admin/amendments")
    def amend(self, body: m.AmendmentRequest | JSON) -> Call[m.Amended]:
        """Amends recorded usage of a closed period, with a reason."""
        return Call(m.Amended, body=body)

    @operation("putBillingDetails", "PUT", "/v1/admin/accounts/{id}/billing")
    def put_billing_details(self, id: str, body: m.BillingDetailsWrite | JSON) -> Call[m.BillingDetails]:
        """Sets an org's billing details, replacing any."""
        return Call(m.BillingDetails, path={"id": id}, body=body)

    @operation("getBillingDetails", "GET", "/v1/admin/accounts/{id}/billing")
    def get_billing_details(self, id: str) -> Call[m.BillingDetails]:
        """An org's billing details (NotFound when it has none)."""
        return Call(m.BillingDetails, path={"id": id})

    @operation("createStaff", "POST", "/v1/admin/staff")
    def create_staff(self, body: m.StaffCreate | JSON) -> Call[m.StaffMemberWithToken]:
        """Adds a staff member with a role; its token is in this reply only."""
        return Call(m.StaffMemberWithToken, body=body)

    @operation("listStaff", "GET", "/v1/admin/staff")
    def list_staff(self) -> Call[m.ListStaffResponse]:
        """Every staff member, revoked ones too, oldest first."""
        return Call(m.ListStaffResponse)

    @operation("revokeStaff", "DELETE", "/v1/admin/staff/{id}")
    def revoke_staff(self, id: str) -> Call[m.StaffMember]:
        """Revokes a staff member; its token is refused from the next request on."""
        return Call(m.StaffMember, path={"id": id})

    @operation("listAudit", "GET", "/v1/admin/audit")
    def list_audit(self, *, actor: str | None = None, before: int | None = None,
                   limit: int | None = None) -> Call[m.ListAuditResponse]:
        """The audit log, newest first; a page of limit entries with ids below before."""
        return Call(m.ListAuditResponse, query={"actor": actor, "before": before, "limit": limit})

    @operation("createCustomerToken", "POST", "/v1/admin/customer-tokens")
    def create_customer_token(self, body: m.CustomerTokenCreate | JSON) -> Call[m.CustomerTokenWithSecret]:
        """Issues a customer token for an account and its subtree; its secret is in this
        reply only."""
        return Call(m.CustomerTokenWithSecret, body=body)

    @operation("listCustomerTokens", "GET", "/v1/admin/customer-tokens")
    def list_customer_tokens(self, *, org: str | None = None, account: str | None = None,
                             include_revoked: bool | None = None) -> Call[m.ListCustomerTokensResponse]:
        """Customer tokens, newest first, without their secrets."""
        return Call(m.ListCustomerTokensResponse,
                    query={"org": org, "account": account, "include_revoked": include_revoked})

    @operation("getCustomerToken", "GET", "/v1/admin/customer-tokens/{id}")
    def get_customer_token(self, id: str) -> Call[m.CustomerToken]:
        """A customer token, live or not, without its secret."""
        return Call(m.CustomerToken, path={"id": id})

    @operation("revokeCustomerToken", "DELETE", "/v1/admin/customer-tokens/{id}")
    def revoke_customer_token(self, id: str) -> Call[m.CustomerToken]:
        """Revokes a customer token on every node."""
        return Call(m.CustomerToken, path={"id": id})

    @operation("createPortalSession", "POST", "/v1/admin/portal-sessions")
    def create_portal_session(self, body: m.PortalSessionCreate | JSON) -> Call[m.PortalSession]:
        """A one-time link to a portal session for a customer."""
        return Call(m.PortalSession, body=body)


class Portal(Namespace[R]):
    """The customer API (a customer token, mgc_…): the token's account and its subtree."""

    @operation("portalMe", "GET", "/v1/portal/me")
    def me(self) -> Call[m.CustomerToken]:
        """The customer token calling, without its secret."""
        return Call(m.CustomerToken)

    @operation("portalGetAccount", "GET", "/v1/portal/accounts/{id}")
    def get_account(self, id: str) -> Call[m.PortalAccount]:
        """An account of the subtree, its limits level by level, and what remains of its
        quotas now."""
        return Call(m.PortalAccount, path={"id": id})

    @operation("portalUpdateAccount", "PUT", "/v1/portal/accounts/{id}")
    def update_account(self, id: str, body: m.PortalAccountWrite | JSON) -> Call[m.PortalAccount]:
        """Sets the limits and concurrency of an account below the token's own."""
        return Call(m.PortalAccount, path={"id": id}, body=body)

    @operation("portalCreateAccount", "POST", "/v1/portal/accounts")
    def create_account(self, body: m.PortalAccountCreate | JSON) -> Call[m.PortalAccount]:
        """Creates a team, user or agent below an account of the subtree."""
        return Call(m.PortalAccount, body=body)

    @operation("portalChildren", "GET", "/v1/portal/accounts/{id}/children")
    def children(self, id: str, *, after: str | None = None, limit: int | None = None) -> Call[m.PortalChildrenResponse]:
        """A page of an account's children, by id; next is the after of the next page."""
        return Call(m.PortalChildrenResponse, path={"id": id}, query={"after": after, "limit": limit})

    @operation("portalUsage", "GET", "/v1/portal/accounts/{id}/usage")
    def usage(self, id: str, *, from_: date | str | None = None, to: date | str | None = None,
              granularity: str | None = None, by: str | None = None, after: str | None = None,
              limit: int | None = None) -> Call[m.PortalUsage]:
        """What an account (by="child": each of its children) used per day or month in
        [from_, to), from the billing log."""
        return Call(m.PortalUsage, path={"id": id}, query={"from": from_, "to": to, "granularity": granularity,
                                                          "by": by, "after": after, "limit": limit})

    @operation("portalKeys", "GET", "/v1/portal/accounts/{id}/api-keys")
    def keys(self, id: str) -> Call[m.PortalKeysResponse]:
        """The API keys of an account of the subtree, newest first, without secrets."""
        return Call(m.PortalKeysResponse, path={"id": id})

    @operation("portalCreateKey", "POST", "/v1/portal/accounts/{id}/api-keys")
    def create_key(self, id: str) -> Call[m.APIKeyReply]:
        """Creates an API key of an account of the subtree; its secret is in this reply only."""
        return Call(m.APIKeyReply, path={"id": id})

    @operation("portalRevokeKey", "DELETE", "/v1/portal/api-keys/{id}")
    def revoke_key(self, id: str) -> Call[None]:
        """Revokes an API key of an account of the subtree."""
        return Call(type(None), path={"id": id})

    @operation("portalBalance", "GET", "/v1/portal/accounts/{id}/balance")
    def balance(self, id: str) -> Call[m.BalanceReply]:
        """The prepaid credit balances of an account of the subtree."""
        return Call(m.BalanceReply, path={"id": id})

    @operation("portalInvoices", "GET", "/v1/portal/invoices")
    def invoices(self, *, after: int | None = None, limit: int | None = None) -> Call[m.PortalInvoicesResponse]:
        """The org's invoices, newest first, without lines."""
        return Call(m.PortalInvoicesResponse, query={"after": after, "limit": limit})

    @operation("portalGetInvoice", "GET", "/v1/portal/invoices/{id}")
    def get_invoice(self, id: int | str) -> Call[m.PortalInvoice]:
        """An invoice of the org with its lines and credit notes."""
        return Call(m.PortalInvoice, path={"id": id})

    @operation("portalGetInvoice", "GET", "/v1/portal/invoices/{id}")
    def get_invoice_file(self, id: int | str, rendering: Rendering) -> Call[bytes]:
        """An invoice of the org rendered: its PDF, HTML page or CSV lines."""
        return Call(bytes, path={"id": f"{id}.{rendering}"})

    @operation("portalCreditNotes", "GET", "/v1/portal/credit-notes")
    def credit_notes(self, *, after: int | None = None, limit: int | None = None) -> Call[m.PortalCreditNotesResponse]:
        """The org's credit notes, newest first, without lines."""
        return Call(m.PortalCreditNotesResponse, query={"after": after, "limit": limit})

    @operation("portalGetCreditNote", "GET", "/v1/portal/credit-notes/{id}")
    def get_credit_note(self, id: int | str) -> Call[m.CreditNote]:
        """A credit note of the org with its lines."""
        return Call(m.CreditNote, path={"id": id})

    @operation("portalGetCreditNote", "GET", "/v1/portal/credit-notes/{id}")
    def get_credit_note_file(self, id: int | str, rendering: Rendering) -> Call[bytes]:
        """A credit note of the org rendered: its PDF, HTML page or CSV lines."""
        return Call(bytes, path={"id": f"{id}.{rendering}"})
