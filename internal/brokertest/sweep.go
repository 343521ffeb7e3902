package brokertest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A test binary that dies before its t.Cleanup runs (killed, timed out,
// crashed) leaves its objects on the broker; quorum queues hold file handles
// there until someone deletes them. The next test binary sweeps them before
// its first test, in two ways:
//
//   - Each binary keeps a journal per broker, one file per process under
//     the OS temp dir, with a line when a name is declared and another when
//     it is deleted. A journal whose process is gone names what is still on
//     the broker, and the sweep deletes that over AMQP. This needs no
//     management plugin.
//   - Where the management API answers, the sweep also deletes objects with
//     a harness name made more than staleAfter ago whose test has no open
//     connection (each test holds its "<prefix>/probe" connection from before
//     its first declaration until after its cleanup): what no local journal
//     knows of, such as objects left from another machine.

// staleAfter is how old a harness name must be before the management sweep
// considers it: well over the management API's delay in listing a new
// connection (about 5s).
const staleAfter = 2 * time.Minute

// journalMaxAge: a journal whose process still seems alive after this long
// is swept anyway (its pid was reused).
const journalMaxAge = 24 * time.Hour

func journalRoot() string { return filepath.Join(os.TempDir(), "dlxbridge-brokertest") }

// brokerKey names a broker's journal directory without writing its URL
// (and password) to disk.
func brokerKey(brokerURL string) string {
	sum := sha256.Sum256([]byte(brokerURL))
	return hex.EncodeToString(sum[:8])
}

// journal is one process's record of the names it declared on one broker.
// Writing is best effort: a journal that cannot be written leaves the
// management sweep and t.Cleanup.
type journal struct {
	path string

	mu sync.Mutex
	f  *os.File
}

var (
	journalsMu sync.Mutex
	journals   = map[string]*journal{}
)

// processJournal is this process's journal for the broker at brokerURL.
func processJournal(brokerURL string) *journal {
	return openJournal(filepath.Join(journalRoot(), brokerKey(brokerURL)), os.Getpid())
}

func openJournal(dir string, pid int) *journal {
	path := filepath.Join(dir, strconv.Itoa(pid)+".journal")
	journalsMu.Lock()
	defer journalsMu.Unlock()
	j := journals[path]
	if j == nil {
		j = &journal{path: path}
		journals[path] = j
	}
	return j
}

func (j *journal) add(o object)          { j.write('+', []object{o}) }
func (j *journal) done(objects []object) { j.write('-', objects) }

func (j *journal) write(op byte, objects []object) {
	if len(objects) == 0 {
		return
	}
	var b strings.Builder
	for _, o := range objects {
		fmt.Fprintf(&b, "%c%c %s\n", op, o.kind, strconv.Quote(o.name))
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		if err := os.MkdirAll(filepath.Dir(j.path), 0o700); err != nil {
			return
		}
		f, err := os.OpenFile(j.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return
		}
		j.f = f
	}
	_, _ = j.f.WriteString(b.String()) // one write: a crash cuts at most this line
}

// outstanding reads a journal: what was declared and not deleted, in order.
func outstanding(path string) ([]object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var objects []object
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 4 || line[2] != ' ' || (line[1] != byte(queue) && line[1] != byte(exchange)) {
			continue // cut short by a crash
		}
		name, err := strconv.Unquote(line[3:])
		if err != nil {
			continue
		}
		o := object{kind(line[1]), name}
		switch line[0] {
		case '+':
			if !slices.Contains(objects, o) {
				objects = append(objects, o)
			}
		case '-':
			objects = slices.DeleteFunc(objects, func(x object) bool { return x == o })
		}
	}
	return objects, sc.Err()
}

// claim takes the journals in dir whose process is gone, by renaming each
// to <name>.<our pid>.sweeping (a rename succeeds for one sweeper only).
// A claim left by a sweeper that died is taken over.
func claim(dir string, now time.Time) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var claimed []string
	for _, ent := range entries {
		base, owner, ok := journalOwner(ent.Name())
		if !ok || owner == self {
			continue
		}
		if info, err := ent.Info(); err != nil || alive(owner) && now.Sub(info.ModTime()) < journalMaxAge {
			continue
		}
		to := filepath.Join(dir, fmt.Sprintf("%s.%d.sweeping", base, self))
		if os.Rename(filepath.Join(dir, ent.Name()), to) == nil {
			claimed = append(claimed, to)
		}
	}
	return claimed
}

// journalOwner parses "<pid>.journal" and "<pid>.journal.<sweeper pid>.sweeping"
// and returns the journal's base name and the pid that holds it.
func journalOwner(name string) (base string, owner int, ok bool) {
	parts := strings.Split(name, ".")
	if len(parts) < 2 || parts[1] != "journal" {
		return "", 0, false
	}
	holder := parts[0]
	switch {
	case len(parts) == 2:
	case len(parts) == 4 && parts[3] == "sweeping":
		holder = parts[2]
	default:
		return "", 0, false
	}
	owner, err := strconv.Atoi(holder)
	return parts[0] + ".journal", owner, err == nil && owner > 0
}

// sweepEarlierRuns deletes what earlier runs left on the broker at
// brokerURL (see the top of this file) and says what it did, or "" if there
// was nothing to do.
func sweepEarlierRuns(root, brokerURL, mgmt string) string {
	now := time.Now()
	dir := filepath.Join(root, brokerKey(brokerURL))
	claimed := claim(dir, now)
	var objects []object
	for _, path := range claimed {
		left, _ := outstanding(path)
		for _, o := range left {
			if !slices.Contains(objects, o) {
				objects = append(objects, o)
			}
		}
	}
	var notes []string
	if mgmt != "" {
		stale, err := staleByManagement(mgmt, brokerURL, now)
		if err != nil {
			notes = append(notes, "management sweep: "+err.Error())
		}
		for _, o := range stale {
			if !slices.Contains(objects, o) {
				objects = append(objects, o)
			}
		}
	}
	var err error
	if len(objects) > 0 {
		var gone []object
		gone, err = deleteEverywhere(brokerURL, objects)
		if len(gone) > 0 {
			notes = append(notes, fmt.Sprintf("swept %d objects that earlier runs left on the broker: %s", len(gone), summary(gone)))
		}
		if err != nil {
			notes = append(notes, "sweep: "+err.Error())
		}
	}
	for _, path := range claimed {
		if err == nil {
			_ = os.Remove(path)
		} else {
			// Give it back under its dead owner's name, for the next run.
			_ = os.Rename(path, filepath.Join(dir, strings.SplitN(filepath.Base(path), ".", 3)[0]+".journal"))
		}
	}
	return strings.Join(notes, "; ")
}

// staleByManagement lists the harness's objects older than staleAfter
// whose test holds no connection.
func staleByManagement(mgmt, brokerURL string, now time.Time) ([]object, error) {
	old, err := listObjects(mgmt, brokerURL, func(name string) bool {
		_, made, ok := prefixTime(name)
		return ok && now.Sub(made) > staleAfter
	})
	if err != nil || len(old) == 0 {
		return nil, err
	}
	// Listed after the objects: a test that owns one of them has held its
	// probe connection since before it declared it.
	conns, err := listConnections(mgmt, brokerURL)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, c := range conns {
		prefix, _, _ := strings.Cut(c.ClientName, "/")
		live[prefix] = true
	}
	return slices.DeleteFunc(old, func(o object) bool {
		prefix, _, _ := prefixTime(o.name)
		return live[prefix]
	}), nil
}

// deleteEverywhere dials the broker and deletes objects over AMQP.
func deleteEverywhere(brokerURL string, objects []object) ([]object, error) {
	conn, err := dialWithin(brokerURL, "dlxbridge-test/sweep", dialTimeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return deleteObjects(conn, objects)
}

// summary names up to five objects.
func summary(objects []object) string {
	var names []string
	for i, o := range objects {
		if i == 5 {
			names = append(names, fmt.Sprintf("and %d more", len(objects)-i))
			break
		}
		names = append(names, o.String())
	}
	return strings.Join(names, ", ")
}
