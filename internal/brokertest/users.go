package brokertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Permissions are a user's rights on the test's virtual host: regular
// expressions over resource names, as the broker takes them ("" allows
// nothing, ".*" everything).
type Permissions struct {
	Configure, Write, Read string
}

// User adds a user with these permissions on the test's virtual host and
// the management tag (so the management API answers it), deleted when
// the test ends, and returns an AMQP URL that logs in as it through the
// test's recording relay. Without a management API it skips the test
// (fails it under CI=true). A test process killed before its cleanup
// leaves the user behind: its name starts with the test's prefix.
func (e *Env) User(p Permissions) string {
	e.T.Helper()
	return e.UserTagged("management", p)
}

// UserTagged is User with other tags, e.g. "monitoring" (comma-separated,
// as the broker takes them).
func (e *Env) UserTagged(tags string, p Permissions) string {
	e.T.Helper()
	e.RequireManagement()
	secret := make([]byte, 12)
	_, _ = rand.Read(secret)
	name, password := e.Name("user."+hex.EncodeToString(secret[:4])), hex.EncodeToString(secret[4:])
	user := "/api/users/" + url.PathEscape(name)
	if err := e.mgmtSend(http.MethodPut, user, map[string]string{"password": password, "tags": tags}); err != nil {
		e.T.Fatalf("add user %s: %v", name, err)
	}
	e.T.Cleanup(func() {
		if err := e.mgmtSend(http.MethodDelete, user, nil); err != nil {
			e.T.Errorf("delete user %s: %v", name, err)
		}
	})
	perms := map[string]string{"configure": p.Configure, "write": p.Write, "read": p.Read}
	if err := e.mgmtSend(http.MethodPut, "/api/permissions/"+e.ManagementVhost()+"/"+url.PathEscape(name), perms); err != nil {
		e.T.Fatalf("set permissions of %s: %v", name, err)
	}
	u, err := url.Parse(e.URL)
	if err != nil {
		e.T.Fatalf("test URL: %v", err)
	}
	u.User = url.UserPassword(name, password)
	return u.String()
}

// mgmtSend sends body as JSON (none if nil) and wants a 2xx answer.
func (e *Env) mgmtSend(method, path string, body any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, strings.TrimRight(e.ManagementURL, "/")+path, r)
	if err != nil {
		return err
	}
	user, pass := credentials(e.brokerURL)
	req.SetBasicAuth(user, pass)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Reason", "dlxbridge test")
	resp, err := mgmtClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, msg)
	}
	return nil
}

// QuorumPolicy sets a policy on the quorum queues whose names match pattern
// (a regular expression; keep it inside the test's Prefix) through the
// management API, and deletes it when the test ends. RabbitMQ before 3.12
// knows no "quorum_queues" apply-to; there the policy applies to "queues",
// which the anchored pattern keeps to the test's own quorum queues.
func (e *Env) QuorumPolicy(name, pattern string, definition map[string]any) {
	e.T.Helper()
	err := e.TryPolicy(name, pattern, "quorum_queues", definition)
	if err != nil && strings.Contains(err.Error(), "unrecognised") {
		err = e.TryPolicy(name, pattern, "queues", definition)
	}
	if err != nil {
		e.T.Fatalf("set policy %s: %v", name, err)
	}
}

// TryPolicy sets a policy (applyTo: queues, classic_queues, quorum_queues,
// exchanges, all) and deletes it when the test ends; it returns the
// broker's refusal, for a test that shows a version cannot express a
// setting (3.10 refuses delivery-limit -1, 4.x refuses ha-mode).
func (e *Env) TryPolicy(name, pattern, applyTo string, definition map[string]any) error {
	e.T.Helper()
	e.RequireManagement()
	path := "/api/policies/" + e.ManagementVhost() + "/" + url.PathEscape(name)
	if err := e.mgmtSend(http.MethodPut, path, map[string]any{"pattern": pattern, "apply-to": applyTo, "definition": definition}); err != nil {
		return err
	}
	e.T.Cleanup(func() {
		if err := e.mgmtSend(http.MethodDelete, path, nil); err != nil {
			e.T.Logf("delete policy %s: %v", name, err)
		}
	})
	return nil
}

// Vhost adds a virtual host named name (start it with the test's Prefix)
// and deletes it, with everything in it, when the test ends.
func (e *Env) Vhost(name string) {
	e.T.Helper()
	e.RequireManagement()
	path := "/api/vhosts/" + url.PathEscape(name)
	if err := e.mgmtSend(http.MethodPut, path, nil); err != nil {
		e.T.Fatalf("add vhost %s: %v", name, err)
	}
	e.T.Cleanup(func() {
		if err := e.mgmtSend(http.MethodDelete, path, nil); err != nil {
			e.T.Errorf("delete vhost %s: %v", name, err)
		}
	})
}
