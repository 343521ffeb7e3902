package sidecar

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// axe-core, the accessibility checker the browser tests inject into the
// page (test tooling only: nothing of it ships). The version is pinned and
// so is its tarball's integrity, which the registry's metadata must state
// too: a changed tarball, or a registry answering for another one, fails
// the test rather than checking the page with unknown code.
const (
	axeVersion   = "4.14.1"
	axeIntegrity = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
	axeRegistry  = "https://registry.npmjs.org/axe-core/"
)

var axeOnce struct {
	sync.Once
	src string
	err error
}

// axeSource returns axe.min.js, from the cache when its tarball is there
// and still has the pinned integrity, else downloaded into it. Without
// the download the test skips, except under CI=true, where it fails.
func axeSource(t *testing.T) string {
	t.Helper()
	axeOnce.Do(func() { axeOnce.src, axeOnce.err = loadAxe() })
	if axeOnce.err != nil {
		msg := fmt.Sprintf("axe-core %s: %v", axeVersion, axeOnce.err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return axeOnce.src
}

// axeCacheDir is DLXBRIDGE_CACHE (else /var/cache/dlxbridge, else the
// user's cache directory) /axe-core/VERSION.
func axeCacheDir() string {
	root := os.Getenv("DLXBRIDGE_CACHE")
	if root == "" {
		root = "/var/cache/dlxbridge"
		if err := os.MkdirAll(filepath.Join(root, "axe-core"), 0o755); err != nil {
			if dir, err := os.UserCacheDir(); err == nil {
				root = filepath.Join(dir, "dlxbridge")
			}
		}
	}
	return filepath.Join(root, "axe-core", axeVersion)
}

func loadAxe() (string, error) {
	dir := axeCacheDir()
	tgz := filepath.Join(dir, "axe-core-"+axeVersion+".tgz")
	if b, err := os.ReadFile(tgz); err == nil && integrity(b) == axeIntegrity {
		return axeFromTarball(b)
	}
	b, err := downloadAxe()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err == nil {
		tmp := tgz + ".tmp"
		if os.WriteFile(tmp, b, 0o644) == nil {
			_ = os.Rename(tmp, tgz)
		}
	}
	return axeFromTarball(b)
}

func integrity(b []byte) string {
	sum := sha512.Sum512(b)
	return "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
}

// downloadAxe reads the version's registry metadata and its tarball, and
// checks both against the pinned integrity.
func downloadAxe() ([]byte, error) {
	client := &http.Client{Timeout: 60 * time.Second}
	get := func(u string) ([]byte, error) {
		resp, err := client.Get(u)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		return io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	}
	meta, err := get(axeRegistry + axeVersion)
	if err != nil {
		return nil, err
	}
	var m struct {
		Dist struct {
			Tarball   string `json:"tarball"`
			Integrity string `json:"integrity"`
		} `json:"dist"`
	}
	if err := json.Unmarshal(meta, &m); err != nil {
		return nil, fmt.Errorf("registry metadata: %w", err)
	}
	if m.Dist.Integrity != axeIntegrity {
		return nil, fmt.Errorf("the registry states integrity %q for %s, not the pinned %q", m.Dist.Integrity, axeVersion, axeIntegrity)
	}
	if !strings.HasPrefix(m.Dist.Tarball, axeRegistry) {
		return nil, fmt.Errorf("the registry's tarball %q is not under %s", m.Dist.Tarball, axeRegistry)
	}
	b, err := get(m.Dist.Tarball)
	if err != nil {
		return nil, err
	}
	if got := integrity(b); got != axeIntegrity {
		return nil, fmt.Errorf("the tarball's integrity is %s, not the pinned %s", got, axeIntegrity)
	}
	return b, nil
}

// axeFromTarball is package/axe.min.js of the npm tarball.
func axeFromTarball(b []byte) (string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", errors.New("the tarball has no package/axe.min.js")
		}
		if err != nil {
			return "", err
		}
		if h.Name == "package/axe.min.js" {
			src, err := io.ReadAll(io.LimitReader(tr, 8<<20))
			return string(src), err
		}
	}
}

// axeViolation is one rule axe-core found broken, with the nodes.
type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target []any  `json:"target"`
		HTML   string `json:"html"`
	} `json:"nodes"`
}

// checkAccessible runs axe-core on the loaded page (injected through
// WebDriver, not by the page) and fails the test on any serious or
// critical violation, naming the rule and the elements.
func (b *browser) checkAccessible(what string) {
	b.t.Helper()
	var res struct {
		Value struct {
			Violations []axeViolation `json:"violations"`
			Passes     int            `json:"passes"`
			Error      string         `json:"error"`
		} `json:"value"`
	}
	script := axeSource(b.t) + `
;return axe.run(document, {resultTypes: ["violations"]}).then(
  r => ({violations: r.violations, passes: r.passes.length}),
  e => ({error: String(e)}));`
	b.do(http.MethodPost, "/execute/sync", map[string]any{"script": script, "args": []any{}}, &res)
	if res.Value.Error != "" {
		b.t.Fatalf("%s: axe-core did not run: %s", what, res.Value.Error)
	}
	var bad []string
	for _, v := range res.Value.Violations {
		if v.Impact != "serious" && v.Impact != "critical" {
			b.t.Logf("%s: axe-core: %s (%s): %s, %d element(s)", what, v.ID, v.Impact, v.Help, len(v.Nodes))
			continue
		}
		var nodes []string
		for _, n := range v.Nodes[:min(len(v.Nodes), 3)] {
			nodes = append(nodes, fmt.Sprint(n.Target)+" "+n.HTML)
		}
		bad = append(bad, fmt.Sprintf("%s (%s): %s\n      %s", v.ID, v.Impact, v.Help, strings.Join(nodes, "\n      ")))
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		b.t.Errorf("%s: axe-core %s finds %d serious or critical violation(s):\n    %s", what, axeVersion, len(bad), strings.Join(bad, "\n    "))
	}
}
