package invoice_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// issuer is the seller of these tests: German customers are taxed at 19 %.
var issuer = invoice.Issuer{
	Prefix:       "MG",
	Seller:       document.Party{LegalName: "Metergate Ltd", Address: []string{"1 Dock Road"}, City: "Dublin", Country: "IE", TaxID: "IE1234567X"},
	CountryTaxBP: map[string]int{"DE": 1900},
}

func (b *testBundle) close(t *testing.T, m time.Time) invoice.Result {
	t.Helper()
	res, err := invoice.Close(b.ctx, b.pool, m, invoice.Options{Force: true, Issuer: issuer})
	require.NoError(t, err)
	return res
}

// line is what the fixture checks of an invoice line.
type line struct {
	kind, unit string
	quantity   int64
	amount     int64
	forPeriod  string
}

func pricedLines(inv invoice.Invoice) []line {
	var out []line
	for _, l := range inv.Lines {
		if l.AmountMinor != 0 || l.Kind == invoice.KindAdjustment || l.Kind == invoice.KindLate {
			out = append(out, line{l.Kind, l.Unit, l.Quantity, l.AmountMinor, l.ForPeriod})
		}
	}
	return out
}

// TestThreeMonthsOfDocuments follows one pro customer (seeded prices: base fee 4,900; 5M
// requests included then 50 per 100,000; 10M tokens included then 2 per 1,000) taxed at
// 19 % through January to March: tiers, prepaid credits, a 5xx refund after January's
// close, a late January event, January voided (a credit note) and reissued under new
// billing details, and an amendment of January settled by a credit note. Every number is
// computed by hand here, then read back and tied out.
func TestThreeMonthsOfDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/team-a", "acme/team-b")
	_, err := invoice.PutBillingDetails(b.ctx, b.pool, invoice.BillingDetails{Org: "acme", Currency: "EUR", UpdatedBy: "test",
		Party: document.Party{LegalName: "Acme GmbH", Address: []string{"Hauptstr. 1"}, City: "Berlin", PostalCode: "10115", Country: "DE"}}, time.Now())
	require.NoError(t, err)
	jan, feb, mar := month(2025, time.January), month(2025, time.February), month(2025, time.March)
	at := func(m time.Time) time.Time { return m.Add(36 * time.Hour) }

	b.event(t, event{path: "acme/team-a", at: at(jan), requests: 6_000_000})
	refunded := b.event(t, event{path: "acme/team-a", at: at(jan), requests: 500_000})
	teamB := b.event(t, event{path: "acme/team-b", at: at(jan), requests: 1_000_000, tokens: 12_000_000})

	// January: 7,500,000 requests: 2,500,000 past the included at 50 per 100,000 = 1,250;
	// 12,000,000 tokens: 2,000,000 at 2 per 1,000 = 4,000. 4,900 + 1,250 + 4,000 = 10,150;
	// tax 19 % = 1,928.5, half away from zero 1,929; total 12,079.
	janInv := b.close(t, jan).Invoices[0]
	require.Equal(t, "MG-2026-000001", strings.Replace(janInv.Number, fmt.Sprint(time.Now().Year()), "2026", 1))
	require.Equal(t, []int64{10150, 1900, 1929, 12079}, []int64{janInv.SubtotalMinor, int64(janInv.TaxRateBP), janInv.TaxMinor, janInv.TotalMinor})
	require.Equal(t, []line{
		{kind: "base_fee", quantity: 1, amount: 4900},
		{kind: "overage_tier", unit: "requests", quantity: 2_500_000, amount: 1250},
		{kind: "overage_tier", unit: "tokens", quantity: 2_000_000, amount: 4000},
	}, pricedLines(janInv))
	require.Equal(t, "Acme GmbH", janInv.Buyer.LegalName)
	require.Equal(t, janInv.IssuedAt.Add(invoice.DefaultPaymentTerms), *janInv.DueAt)

	// After the close: the 500,000 requests' outcome is a 5xx, and 300,000 late requests.
	_, err = b.pool.Exec(b.ctx, `insert into usage_outcomes (event_id, status, outcome_time, source, kafka_partition, kafka_offset)
		values ($1, 503, $2, 'test', 0, 999999)`, refunded, at(jan))
	require.NoError(t, err)
	b.event(t, event{path: "acme/team-a", at: at(jan), requests: 300_000, late: true})
	b.event(t, event{path: "acme/team-a", at: at(feb), requests: 4_000_000})
	// February's 14,000,000 tokens drew 3,000,000 from the org's prepaid grant.
	grant := b.grant(t, "acme", "acme", "tokens", 3_000_000)
	febTokens := b.event(t, event{path: "acme/team-b", at: at(feb), tokens: 14_000_000})
	b.draw(t, febTokens, at(feb), "acme", grant, "acme", "tokens", 3_000_000)

	// February: 4,000,000 requests, all included; tokens: 14,000,000 less 3,000,000 paid by
	// credits = 11,000,000, 1,000,000 past the included at 2 per 1,000 = 2,000. January's
	// correction first: 7,000,000 requests bill now, price 1,000 against 1,250 billed: -250
	// for -500,000. Then the late 300,000 at the margin: price(7,300,000) - price(7,000,000)
	// = 1,150 - 1,000 = 150. 4,900 + 2,000 - 250 + 150 = 6,800; tax 1,292; total 8,092.
	febInv := b.close(t, feb).Invoices[0]
	require.Equal(t, []int64{6800, 1292, 8092}, []int64{febInv.SubtotalMinor, febInv.TaxMinor, febInv.TotalMinor})
	require.Equal(t, []line{
		{kind: "base_fee", quantity: 1, amount: 4900},
		{kind: "overage_tier", unit: "tokens", quantity: 1_000_000, amount: 2000},
		{kind: "adjustment", unit: "requests", quantity: -500_000, amount: -250, forPeriod: "2025-01-01"},
		{kind: "late", unit: "requests", quantity: 300_000, amount: 150, forPeriod: "2025-01-01"},
	}, pricedLines(febInv))
	var applied int64
	for _, l := range febInv.Lines {
		if l.Kind == invoice.KindCreditsApplied {
			applied += l.Quantity
		}
	}
	require.Equal(t, int64(3_000_000), applied, "the credits' 3,000,000 tokens")
	b.tiesOut(t)

	// January is voided: a credit note of its whole amount, in the credit notes' sequence.
	voided, note, err := invoice.SetStatus(b.ctx, b.pool, issuer, janInv.ID, invoice.StatusVoid, "wrong legal name", "finance@test")
	require.NoError(t, err)
	require.Equal(t, invoice.StatusVoid, voided.Status)
	require.Regexp(t, `^MG-CN-\d{4}-000001$`, note.Number)
	require.Equal(t, []int64{10150, 1929, 12079}, []int64{note.SubtotalMinor, note.TaxMinor, note.TotalMinor})
	require.Equal(t, janInv.Lines, note.Lines, "the credit note credits the invoice's lines as they were")
	b.tiesOut(t)

	// The reissue, under the new legal name: January as it bills now (7,000,000 requests:
	// 1,000; tokens 4,000; base fee 4,900), and what February billed for January (-500,000
	// for -250, +300,000 for +150) re-priced against it: January bills 7,300,000 requests
	// for price 1,150; billed 7,000,000 - 200,000 = 6,800,000 for 1,000 - 100 = 900; the
	// adjustment is +500,000 for +250. 4,900 + 1,000 + 4,000 + 250 = 10,150; tax 1,929;
	// total 12,079. With February's -100, January costs 10,050 = 4,900 + 1,150 + 4,000.
	_, err = invoice.PutBillingDetails(b.ctx, b.pool, invoice.BillingDetails{Org: "acme", UpdatedBy: "test",
		Party: document.Party{LegalName: "Acme Deutschland GmbH", City: "Berlin", Country: "DE"}}, time.Now())
	require.NoError(t, err)
	re, err := invoice.Reissue(b.ctx, b.pool, issuer, janInv.ID, "legal name corrected", "finance@test", time.Now())
	require.NoError(t, err)
	require.Equal(t, janInv.ID, *re.Replaces)
	require.Equal(t, []int64{10150, 1929, 12079}, []int64{re.SubtotalMinor, re.TaxMinor, re.TotalMinor})
	require.Equal(t, []line{
		{kind: "base_fee", quantity: 1, amount: 4900},
		{kind: "overage_tier", unit: "requests", quantity: 2_000_000, amount: 1000},
		{kind: "overage_tier", unit: "tokens", quantity: 2_000_000, amount: 4000},
		{kind: "adjustment", unit: "requests", quantity: 500_000, amount: 250, forPeriod: "2025-01-01"},
	}, pricedLines(re))
	require.Equal(t, "Acme Deutschland GmbH", re.Buyer.LegalName)
	b.tiesOut(t)
	_, err = invoice.Reissue(b.ctx, b.pool, issuer, janInv.ID, "again", "finance@test", time.Now())
	require.ErrorIs(t, err, invoice.ErrAlreadyReissued)

	// team-b's January tokens were 11,000,000, not 12,000,000: amended, settled by a credit
	// note on the reissue. January's tokens price 2,000 now against 4,000 charged: 2,000,
	// tax 380, total 2,380; the second credit note.
	am, err := invoice.Amend(b.ctx, b.pool, issuer, invoice.Amendment{EventIDs: []string{teamB}, Action: invoice.AmendSetUnits,
		Units: map[string]int64{"tokens": 11_000_000}, Reason: "metered twice", Settle: invoice.SettleCreditNote, By: "finance@test"})
	require.NoError(t, err)
	require.Equal(t, re.ID, am.CreditNote.InvoiceID)
	require.Equal(t, []int64{2000, 380, 2380}, []int64{am.CreditNote.SubtotalMinor, am.CreditNote.TaxMinor, am.CreditNote.TotalMinor})
	require.Regexp(t, `^MG-CN-\d{4}-000002$`, am.CreditNote.Number)
	b.tiesOut(t)

	// March: nothing used, nothing to correct (the credit note settled the amendment): the
	// base fee; 4,900 + 931 = 5,831.
	marInv := b.close(t, mar).Invoices[0]
	require.Equal(t, []int64{4900, 931, 5831}, []int64{marInv.SubtotalMinor, marInv.TaxMinor, marInv.TotalMinor})
	require.Equal(t, []line{{kind: "base_fee", quantity: 1, amount: 4900}}, pricedLines(marInv))
	b.tiesOut(t)

	// Billing events, one per document and status change, written with them: four invoices
	// issued, January voided, two credit notes. The reissue's says what its invoice says.
	for typ, want := range map[string]int64{invoice.EventInvoiceIssued: 4, invoice.EventInvoiceStatusChanged: 1, invoice.EventCreditNoteIssued: 2} {
		require.Equal(t, want, b.count(t, `select count(*) from billing_events where type = $1 and org = 'acme'`, typ), typ)
	}
	var ceType, subject, number string
	var total int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `select payload->>'type', payload->>'subject', payload->'data'->>'number',
		(payload->'data'->>'total_minor')::bigint from billing_events where id = $1`, "invoice.issued/"+re.Number).
		Scan(&ceType, &subject, &number, &total))
	require.Equal(t, []any{"io.metergate.invoice.issued.v1", "invoice/" + re.Number, re.Number, re.TotalMinor},
		[]any{ceType, subject, number, total})

	// Numbers: January 1, February 2, the reissue 3, March 4.
	var numbers []string
	for _, inv := range []invoice.Invoice{janInv, febInv, re, marInv} {
		numbers = append(numbers, inv.Number[len(inv.Number)-6:])
	}
	require.Equal(t, []string{"000001", "000002", "000003", "000004"}, numbers)

	// The PDF of the reissue, as pdftotext reads it, says what its JSON says.
	var pdf bytes.Buffer
	require.NoError(t, document.PDF(&pdf, re.Document(janInv.Number)))
	text := strings.Join(testenv.PDFText(t, pdf.Bytes()), "\n")
	for _, want := range []string{re.Number, janInv.Number, "Acme Deutschland GmbH", "Metergate Ltd", "EUR 101.50", "EUR 19.29",
		"EUR 120.79", "EUR 2.50", "19.00 %"} {
		require.Contains(t, text, want)
	}
}

// TestConcurrentClosesAndVoidsLeaveNoGap runs two closes of a month and the void of an
// invoice of the month before at once, with an org whose data fails it before it is priced
// (huge) and one whose invoice PostgreSQL refuses after it was numbered (a trigger refuses
// its lines): the numbers given are 1..n, each once, with no gap.
func TestConcurrentClosesAndVoidsLeaveNoGap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dec, jan := month(2024, time.December), month(2025, time.January)
	for i := range 12 {
		org := fmt.Sprintf("org-%02d", i)
		b.org(t, org, "pro")
		b.event(t, event{path: org, at: dec.Add(time.Hour), requests: 100})
		b.event(t, event{path: org, at: jan.Add(time.Hour), requests: 6_000_000})
	}
	b.org(t, "huge", "pro")
	for range 2 {
		b.event(t, event{path: "huge", at: jan.Add(time.Hour), tokens: 4_650_000_000_000_000_000}) // sums past bigint
	}
	b.org(t, "org-05-trap", "pro") // sorts among the others: a number lost would leave a gap
	b.event(t, event{path: "org-05-trap", at: jan.Add(time.Hour), requests: 10})
	for _, q := range []string{
		`create function trap_lines() returns trigger language plpgsql as $$
		 begin
		   if exists (select 1 from invoices where id = new.invoice_id and org = 'org-05-trap') then
		     raise exception 'trap refuses the lines of its invoice';
		   end if;
		   return new;
		 end $$`,
		`create trigger trap_lines before insert on invoice_lines for each row execute function trap_lines()`,
	} {
		_, err := b.pool.Exec(b.ctx, q)
		require.NoError(t, err, q)
	}
	decRes, err := invoice.Close(b.ctx, b.pool, dec, invoice.Options{Force: true, Issuer: issuer})
	require.ErrorIs(t, err, invoice.ErrInvoicesFailed, "the trap's December invoice")
	decInvs := decRes.Invoices

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 2 {
		wg.Go(func() {
			_, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true, Issuer: issuer})
			if !errors.Is(err, invoice.ErrInvoicesFailed) {
				errs <- fmt.Errorf("close: want ErrInvoicesFailed (huge, the trap), got %w", err)
			}
		})
	}
	wg.Go(func() {
		if _, _, err := invoice.SetStatus(b.ctx, b.pool, issuer, decInvs[3].ID, invoice.StatusVoid, "duplicate", "test"); err != nil {
			errs <- err
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	rows, err := b.pool.Query(b.ctx, `select right(number, 6) from invoices order by number`)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		got = append(got, n)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 25, "13 December invoices (huge pays the base fee), 12 January ones: huge's and the trap's failed")
	for i, n := range got {
		require.Equal(t, fmt.Sprintf("%06d", i+1), n, "invoice numbers run 1..n with no gap")
	}
	require.Equal(t, int64(1), b.count(t, `select count(*) from credit_notes where right(number, 6) = '000001'`))
	require.Equal(t, int64(25), b.count(t, `select last from document_sequences where kind = 'invoice'`))
	require.Equal(t, int64(2), b.count(t, `select count(*) from invoice_failures where org = 'huge'`))
	require.Equal(t, int64(3), b.count(t, `select count(*) from invoice_failures where org = 'org-05-trap'`), "December, and January twice")
	b.tiesOut(t)
}

// TestAVoidHoldsItsPeriodUntilReissued voids January without reissuing it: February's close
// neither bills January again (no correction re-bills the voided usage) nor its late event,
// which waits; once January is reissued, March's close bills the late event.
func TestAVoidHoldsItsPeriodUntilReissued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/team-a")
	jan, feb, mar := month(2025, time.January), month(2025, time.February), month(2025, time.March)
	b.event(t, event{path: "acme/team-a", at: jan.Add(time.Hour), requests: 6_000_000})
	janInv := b.close(t, jan).Invoices[0]
	_, _, err := invoice.SetStatus(b.ctx, b.pool, issuer, janInv.ID, invoice.StatusVoid, "disputed", "test")
	require.NoError(t, err)
	b.event(t, event{path: "acme/team-a", at: jan.Add(2 * time.Hour), requests: 200_000, late: true})
	require.Equal(t, int64(1), b.count(t, `select count(*) from finance_late_events where held and billed_on is null`))

	febInv := b.close(t, feb).Invoices[0]
	require.Equal(t, []line{{kind: "base_fee", quantity: 1, amount: 4900}}, pricedLines(febInv), "nothing of the held January")
	b.tiesOut(t)

	re, err := invoice.Reissue(b.ctx, b.pool, issuer, janInv.ID, "dispute settled", "test", time.Now())
	require.NoError(t, err)
	require.Equal(t, janInv.SubtotalMinor, re.SubtotalMinor, "the same usage, the same amount")
	// March bills the late 200,000 at January's margin: 6,200,000 - 5,000,000 included at 50
	// per 100,000 = 600, against 500 billed: 100.
	marInv := b.close(t, mar).Invoices[0]
	require.Equal(t, []line{
		{kind: "base_fee", quantity: 1, amount: 4900},
		{kind: "late", unit: "requests", quantity: 200_000, amount: 100, forPeriod: "2025-01-01"},
	}, pricedLines(marInv))
	b.tiesOut(t)
}

// TestAmendmentsOfAClosedPeriod amends January after its close: one event voided and
// settled at once by a credit note, another's units cut and settled on February's invoice;
// then January is voided, and its credit note credits what the first did not. Bad
// amendments write nothing.
func TestAmendmentsOfAClosedPeriod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/team-a", "acme/team-b")
	_, err := invoice.PutBillingDetails(b.ctx, b.pool, invoice.BillingDetails{Org: "acme", UpdatedBy: "test",
		Party: document.Party{LegalName: "Acme GmbH", Country: "DE"}}, time.Now())
	require.NoError(t, err)
	jan, feb := month(2025, time.January), month(2025, time.February)
	b.event(t, event{path: "acme/team-a", at: jan.Add(time.Hour), requests: 6_000_000})
	cut := b.event(t, event{path: "acme/team-b", at: jan.Add(time.Hour), requests: 1_000_000})
	wrong := b.event(t, event{path: "acme/team-a", at: jan.Add(time.Hour), requests: 400_000})
	open := b.event(t, event{path: "acme/team-a", at: feb.Add(time.Hour), requests: 1})

	// January: 7,400,000 requests, 2,400,000 past the included at 50 per 100,000 = 1,200;
	// 4,900 + 1,200 = 6,100; tax 1,159; total 7,259.
	janInv := b.close(t, jan).Invoices[0]
	require.Equal(t, []int64{6100, 1159, 7259}, []int64{janInv.SubtotalMinor, janInv.TaxMinor, janInv.TotalMinor})

	amend := func(a invoice.Amendment) (invoice.Amended, error) {
		a.By = "finance@test"
		return invoice.Amend(b.ctx, b.pool, issuer, a)
	}
	written := func() int64 {
		return b.count(t, `select (select count(*) from amendments) + (select count(*) from credit_notes)`)
	}
	for _, bad := range []struct {
		a    invoice.Amendment
		want error
	}{
		{invoice.Amendment{EventIDs: []string{"no-such-event"}, Action: invoice.AmendVoid, Reason: "x", Settle: invoice.SettleNextInvoice}, invoice.ErrUnknownEvent},
		{invoice.Amendment{EventIDs: []string{wrong, "no-such-event"}, Action: invoice.AmendVoid, Reason: "x", Settle: invoice.SettleNextInvoice}, invoice.ErrUnknownEvent},
		{invoice.Amendment{EventIDs: []string{open}, Action: invoice.AmendVoid, Reason: "x", Settle: invoice.SettleNextInvoice}, invoice.ErrPeriodOpen},
		{invoice.Amendment{EventIDs: []string{wrong}, Action: invoice.AmendSetUnits, Units: map[string]int64{"requests": 500_000}, Reason: "x", Settle: invoice.SettleCreditNote}, invoice.ErrNotACredit},
		{invoice.Amendment{EventIDs: []string{wrong}, Action: invoice.AmendSetUnits, Units: map[string]int64{"requests": invoice.MaxUnits + 1}, Reason: "x", Settle: invoice.SettleNextInvoice}, invoice.ErrInvalidAmendment},
		{invoice.Amendment{EventIDs: []string{wrong}, Action: invoice.AmendSetUnits, Units: map[string]int64{"apples": 1}, Reason: "x", Settle: invoice.SettleNextInvoice}, invoice.ErrInvalidAmendment},
		{invoice.Amendment{EventIDs: []string{wrong}, Action: invoice.AmendVoid, Settle: invoice.SettleNextInvoice}, invoice.ErrInvalidReason},
	} {
		_, err := amend(bad.a)
		require.ErrorIs(t, err, bad.want, "%+v", bad.a)
	}
	require.Zero(t, written(), "a refused amendment writes nothing")

	// The 400,000 requests were billed in error: voided, credited at once. January bills
	// 7,000,000 now: price 1,000 against 1,200 charged: a credit of 200, tax 38, total 238.
	am, err := amend(invoice.Amendment{EventIDs: []string{wrong}, Action: invoice.AmendVoid, Reason: "test traffic", Settle: invoice.SettleCreditNote})
	require.NoError(t, err)
	note := am.CreditNote
	require.NotNil(t, note)
	require.Equal(t, []int64{200, 38, 238}, []int64{note.SubtotalMinor, note.TaxMinor, note.TotalMinor})
	require.Equal(t, janInv.ID, note.InvoiceID)
	require.Equal(t, []line{{kind: "adjustment", unit: "requests", quantity: 400_000, amount: 200, forPeriod: "2025-01-01"}},
		pricedLines(invoice.Invoice{Lines: note.Lines}))
	b.tiesOut(t)

	// team-b's 1,000,000 were 500,000: settled on February's invoice. February: 4,900, and
	// January's correction: 6,500,000 bill now, price 750 against 1,000 charged: -250.
	// 4,650; tax 883.5, half away from zero 884; total 5,534.
	_, err = amend(invoice.Amendment{EventIDs: []string{cut}, Action: invoice.AmendSetUnits, Units: map[string]int64{"requests": 500_000},
		Reason: "double-counted retries", Settle: invoice.SettleNextInvoice})
	require.NoError(t, err)
	febInv := b.close(t, feb).Invoices[0]
	require.Equal(t, []int64{4650, 884, 5534}, []int64{febInv.SubtotalMinor, febInv.TaxMinor, febInv.TotalMinor})
	require.Equal(t, []line{
		{kind: "base_fee", quantity: 1, amount: 4900},
		{kind: "adjustment", unit: "requests", quantity: -500_000, amount: -250, forPeriod: "2025-01-01"},
	}, pricedLines(febInv))
	b.tiesOut(t)

	// January voided: its credit note credits 7,259 less the 238 credited already.
	_, void, err := invoice.SetStatus(b.ctx, b.pool, issuer, janInv.ID, invoice.StatusVoid, "re-issue", "finance@test")
	require.NoError(t, err)
	require.Equal(t, []int64{5900, 1121, 7021}, []int64{void.SubtotalMinor, void.TaxMinor, void.TotalMinor})
	b.tiesOut(t)
}

// TestCorrectionsPastTheWindow: a 5xx reported five months after its month, past the
// three months every close looks at, is still corrected by the next close.
func TestCorrectionsPastTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro")
	jan := month(2025, time.January)
	b.event(t, event{path: "acme", at: jan.Add(time.Hour), requests: 6_000_000})
	failed := b.event(t, event{path: "acme", at: jan.Add(time.Hour), requests: 500_000})
	for m := range 5 { // January to May
		b.close(t, jan.AddDate(0, m, 0))
	}
	_, err := b.pool.Exec(b.ctx, `insert into usage_outcomes (event_id, status, outcome_time, source, kafka_partition, kafka_offset)
		values ($1, 502, $2, 'test', 0, 999999)`, failed, jan.Add(time.Hour))
	require.NoError(t, err)
	// June: 4,900, and January's correction: 6,000,000 bill now, price 500 against 750: -250.
	jun := b.close(t, jan.AddDate(0, 5, 0)).Invoices[0]
	require.Equal(t, []line{
		{kind: "base_fee", quantity: 1, amount: 4900},
		{kind: "adjustment", unit: "requests", quantity: -500_000, amount: -250, forPeriod: "2025-01-01"},
	}, pricedLines(jun))
	b.tiesOut(t)
}

func TestMaxUnitsIsPolicysMaxAmount(t *testing.T) {
	t.Parallel()
	require.EqualValues(t, policy.MaxAmount, invoice.MaxUnits)
}

// TestOneOrgPastBigintDoesNotStopTheBooks: after January's close, outcomes make one org's
// billable tokens for January sum past bigint. The tie-out still answers (a row for that
// org), and February's close issues the other org's invoice and fails that org alone.
func TestOneOrgPastBigintDoesNotStopTheBooks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro")
	b.org(t, "huge", "pro")
	jan, feb := month(2025, time.January), month(2025, time.February)
	b.event(t, event{path: "acme", at: jan.Add(time.Hour), requests: 10})
	var huge []string
	for range 2 {
		huge = append(huge, b.event(t, event{path: "huge", at: jan.Add(time.Hour), tokens: 1_000}))
	}
	b.close(t, jan)
	for i, id := range huge {
		_, err := b.pool.Exec(b.ctx, `insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
			values ($1, 200, 4650000000000000000, $2, 'test', 0, $3)`, id, jan.Add(time.Hour), 900000+i)
		require.NoError(t, err)
	}

	diffs, err := invoice.TieOut(b.ctx, b.pool)
	require.NoError(t, err, "one org's sum past bigint is a row of the tie-out, not an error for everyone")
	require.NotEmpty(t, diffs)
	for _, d := range diffs {
		require.Equal(t, "huge", d.Org)
	}
	res, err := invoice.Close(b.ctx, b.pool, feb, invoice.Options{Force: true, Issuer: issuer})
	require.ErrorIs(t, err, invoice.ErrInvoicesFailed)
	require.Len(t, res.Invoices, 1)
	require.Equal(t, "acme", res.Invoices[0].Org)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "huge", res.Failed[0].Org)
	require.Contains(t, res.Failed[0].Error, "past the largest quantity")
}
