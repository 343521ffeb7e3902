package consumer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// logBuffer collects a logger's output; the runtime logs from several
// goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// runAlone builds a consumer from cfg (a copy, with its own logger, no
// metrics registry and a 2s PermanentFailureTimeout), registers a handler on
// the bundle's queue and runs it until Run returns or within passes. It
// returns New's error, or Run's, and everything logged.
func (b *testBundle) runAlone(cfg Config, within time.Duration) (newErr, runErr error, returned bool, logs string) {
	b.t.Helper()
	var lb logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&lb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Registerer = nil
	cfg.PermanentFailureTimeout = 2 * time.Second
	cfg.hooks = &testHooks{}
	c, err := New(&cfg)
	if err != nil {
		return err, nil, false, lb.String()
	}
	must(b.t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return nil })))
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		return nil, err, ctx.Err() == nil, lb.String()
	case <-time.After(within + 15*time.Second):
		b.t.Fatal("Run did not return after its context ended")
		return nil, nil, false, ""
	}
}

// withPassword is env's URL with its password replaced by password,
// written as is (not percent-encoded), as a user might paste it.
func withPassword(t testing.TB, envURL, user, password string) string {
	t.Helper()
	u, err := url.Parse(envURL)
	if err != nil {
		t.Fatal(err)
	}
	if user == "" {
		user = u.User.Username()
	}
	return brokertest.WithPassword(u.Scheme, user, password, u.Host+u.EscapedPath())
}

// A password Go's URL parser chokes on must never reach an error or a log,
// and a URL that doesn't parse must be refused by New rather than logged on
// every reconnect. The one that parses (p@ss) reaches the broker, which
// refuses the unknown user: Run returns instead of retrying forever.
func TestHostilePasswordsNeverLeakAndBadURLsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, s := range brokertest.HostileSecrets() {
		cfg := *b.cfg
		cfg.URL = withPassword(t, b.env.URL, "leakuser", s.Password)
		newErr, runErr, returned, logs := b.runAlone(cfg, 30*time.Second)
		switch {
		case newErr != nil:
			s.Check(t, "New's error", newErr.Error())
		case !returned:
			t.Errorf("password %q: New accepted the URL and Run kept retrying until cancelled", s.Password)
		case runErr == nil:
			t.Errorf("password %q: Run returned nil for a login the broker refuses", s.Password)
		default:
			s.Check(t, "Run's error", runErr.Error())
		}
		s.Check(t, "the log", logs)
	}
}

// A wrong password is permanent: Run tries a few times, then returns an
// error that says so (without the password) instead of logging
// "reconnecting" forever.
func TestRunReturnsOnWrongPassword(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	cfg := *b.cfg
	const wrong = "n0t-the-pa55"
	cfg.URL = withPassword(t, b.env.URL, "", wrong)
	start := time.Now()
	newErr, runErr, returned, logs := b.runAlone(cfg, 30*time.Second)
	if newErr != nil {
		t.Fatalf("New: %v", newErr)
	}
	if !returned || runErr == nil {
		t.Fatalf("Run did not give up on a refused login (returned %v, err %v); log:\n%s", returned, runErr, logs)
	}
	t.Logf("Run returned after %s: %v", time.Since(start).Round(time.Millisecond), runErr)
	if !errors.Is(runErr, amqp.ErrCredentials) || !strings.Contains(runErr.Error(), "refused the login") {
		t.Errorf("Run's error does not say the login was refused: %v", runErr)
	}
	for _, out := range []string{runErr.Error(), logs} {
		if strings.Contains(out, wrong) {
			t.Errorf("output shows the password:\n%s", out)
		}
	}
	if strings.Contains(logs, "connection lost; reconnecting") {
		t.Errorf("a refused login was logged as a lost connection:\n%s", logs)
	}
}

// A work queue that does not exist is permanent too: Run returns an error
// naming it.
func TestRunReturnsOnMissingQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	if _, err := b.env.Channel("admin").QueueDelete(b.queue.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	newErr, runErr, returned, logs := b.runAlone(*b.cfg, 30*time.Second)
	took := time.Since(start)
	if newErr != nil {
		t.Fatalf("New: %v", newErr)
	}
	if !returned || runErr == nil {
		t.Fatalf("Run did not give up on a missing queue (returned %v, err %v); log:\n%s", returned, runErr, logs)
	}
	t.Logf("Run returned after %s: %v", took.Round(time.Millisecond), runErr)
	// The log says it gives up after PermanentFailureTimeout (runAlone's
	// 2s): it must not give up sooner because its next backoff would have
	// slept past it (it then tries once more at the limit).
	if took < 2*time.Second {
		t.Errorf("Run gave up after %s, before its PermanentFailureTimeout of 2s; log:\n%s", took.Round(time.Millisecond), logs)
	}
	var ae *amqp.Error
	if !errors.As(runErr, &ae) || ae.Code != amqp.NotFound || !strings.Contains(runErr.Error(), b.queue.Name) {
		t.Errorf("Run's error does not name the missing queue: %v", runErr)
	}
	if strings.Contains(logs, "connection lost; reconnecting") {
		t.Errorf("a missing queue was logged as a lost connection:\n%s", logs)
	}
}
