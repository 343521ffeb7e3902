package sidecar

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// runtimeQuarantines runs the runtime in process with a signing key, so
// that what it quarantines carries a signed envelope its keeper verifies,
// publishes bodies (id → body, schema-invalid ones are quarantined at
// once), and calls during (if not nil) while it runs; it stops once the
// quarantine holds want records.
func (b *pageBundle) runtimeQuarantines(bodies map[string]string, during func(), want int) {
	b.t.Helper()
	c, err := consumer.New(&consumer.Config{URL: b.env.URL, File: b.cfg, Registry: b.reg, ConnectionName: b.env.Prefix + "/runtime",
		SigningKey: []byte("the consumers' key, 32 bytes...."), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.t.Fatal(err)
	}
	if err := c.Handle(b.q.Name, "test.job", consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })); err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			b.t.Errorf("runtime: %v", err)
		}
	}()
	for id, body := range bodies {
		conf, err := b.pub.PublishWithDeferredConfirmWithContext(context.Background(), b.q.Exchange.Name, "k", true, false, amqp.Publishing{
			MessageId: id, Type: "test.job", ContentType: "application/json", Headers: amqp.Table{"schema-version": "1"}, Body: []byte(body)})
		if err != nil {
			b.t.Fatal(err)
		}
		if ok, err := conf.WaitContext(context.Background()); err != nil || !ok {
			b.t.Fatalf("publish: ack %v, %v", ok, err)
		}
	}
	if during != nil {
		during()
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(b.snapshot().Records) < want {
		if time.Now().After(deadline) {
			b.t.Fatalf("the runtime stored fewer than %d records in 30s", want)
		}
		select {
		case err := <-ran:
			b.t.Fatalf("runtime stopped: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// groupRowOf is the overview's table row of one group.
func groupRowOf(t *testing.T, page, fingerprint string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr class="group" data-queue="[^"]*" data-fingerprint="` + regexp.QuoteMeta(fingerprint) + `">.*?</tr>`).FindString(page)
	if m == "" {
		t.Fatalf("no group row for fingerprint %q:\n%s", fingerprint, page)
	}
	return m
}

// The page says whether an envelope was verified wherever the CLI marks
// it ("?" after a claimed envelope's class, "(unverified)" for one whose
// signature failed): the overview's groups, a group's records, a record,
// and a replay's dry run, where the operator decides.
func TestPageShowsWhetherEnvelopesWereVerified(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	// Claimed: an envelope on the intake, stored by a keeper without the
	// consumers' key.
	b.quarantine(2, "fp-claimed", "claimed failure", func(i int) string { return fmt.Sprintf(`{"id":"c-%d"}`, i) }, nil)
	b.keep(2)
	// Signed: two schema-invalid messages the runtime quarantines; and,
	// while its verifying keeper runs, an unsigned envelope on the intake,
	// whose claim it does not take.
	b.runtimeQuarantines(map[string]string{"s-0": `{"nope":0}`, "s-1": `{"nope":1}`}, func() {
		b.quarantine(1, "fp-forged", "forged", func(int) string { return `{"id":"f-0"}` }, nil)
	}, 5)

	byKind := map[string][]*quarantine.Record{}
	for _, r := range b.snapshot().Records {
		k := "unverified"
		switch {
		case r.Envelope.Verified:
			k = "verified"
		case r.Envelope.Source == quarantine.SourceBridge:
			k = "claimed"
		}
		byKind[k] = append(byKind[k], r)
	}
	if len(byKind["claimed"]) != 2 || len(byKind["verified"]) != 2 || len(byKind["unverified"]) != 1 {
		t.Fatalf("seeded %d claimed, %d verified, %d unverified; want 2, 2, 1", len(byKind["claimed"]), len(byKind["verified"]), len(byKind["unverified"]))
	}
	signed := byKind["verified"][0].Envelope
	const token = "0123456789abcdef-operator"
	srv := b.server(token)

	code, page := get(t, srv.URL+"/quarantine")
	if code != http.StatusOK {
		t.Fatalf("overview: %d", code)
	}
	claimedRow, signedRow, forgedRow := groupRowOf(t, page, "fp-claimed"), groupRowOf(t, page, signed.Fingerprint), groupRowOf(t, page, "")
	if !strings.Contains(claimedRow, `permanent<span class="mark"`) || !strings.Contains(claimedRow, "2 claimed, not verified (?)") || strings.Contains(claimedRow, "signed") {
		t.Errorf("overview, claimed group:\n%s", claimedRow)
	}
	if strings.Contains(signedRow, `class="mark"`) || !strings.Contains(signedRow, "2 signed") || strings.Contains(signedRow, "claimed") {
		t.Errorf("overview, signed group:\n%s", signedRow)
	}
	if !strings.Contains(forgedRow, "(unverified)") || !strings.Contains(forgedRow, "1 signature did not verify") {
		t.Errorf("overview, forged group:\n%s", forgedRow)
	}

	groupURL := func(e quarantine.Envelope) string {
		return srv.URL + "/quarantine/group?" + url.Values{"queue": {b.q.Name}, "class": {string(e.Class)}, "fingerprint": {e.Fingerprint}}.Encode()
	}
	_, page = get(t, groupURL(byKind["claimed"][0].Envelope))
	if n := strings.Count(page, `<td class="verdict claimed"`); n != 2 || strings.Contains(page, `<td class="verdict verified"`) {
		t.Errorf("claimed group lists %d claimed records:\n%s", n, page)
	}
	_, page = get(t, groupURL(signed))
	if n := strings.Count(page, `<td class="verdict verified"`); n != 2 || strings.Contains(page, `<td class="verdict claimed"`) {
		t.Errorf("signed group lists %d signed records:\n%s", n, page)
	}

	for kind, want := range map[string]string{
		"claimed":    `id="verdict" class="verdict claimed">NOT verified`,
		"verified":   `id="verdict" class="verdict verified">signed by the runtime`,
		"unverified": `id="verdict" class="verdict unverified">NOT verified`,
	} {
		_, page = get(t, srv.URL+"/quarantine/record/"+byKind[kind][0].ID)
		if !strings.Contains(page, want) {
			t.Errorf("%s record page lacks %q:\n%s", kind, want, page)
		}
	}

	dryRun := func(e quarantine.Envelope) string {
		t.Helper()
		code, page := post(t, srv.URL+"/quarantine/replay", url.Values{"queue": {b.q.Name}, "class": {string(e.Class)},
			"fingerprint": {e.Fingerprint}, "token": {token}, "rate": {"0"}, "skip_invalid": {"1"}})
		if code != http.StatusOK {
			t.Fatalf("dry run: %d\n%s", code, page)
		}
		return page
	}
	page = dryRun(byKind["claimed"][0].Envelope)
	if n := strings.Count(page, `<td class="verdict claimed"`); n != 2 || !strings.Contains(page, `id="unverified-note">2 of the record(s)`) {
		t.Errorf("claimed group's dry run marks %d records:\n%s", n, page)
	}
	page = dryRun(signed)
	if n := strings.Count(page, `<td class="verdict verified"`); n != 2 || strings.Contains(page, "unverified-note") {
		t.Errorf("signed group's dry run shows %d signed records:\n%s", n, page)
	}
}
