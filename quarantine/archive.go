package quarantine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// An archive is a directory holding records.jsonl (one record per line,
// everything a record keeps: its properties, its headers in the typed
// encoding of the records stream, its envelope and its payload in base64)
// and manifest.json (a SHA-256 per line and of the whole file). It is how
// records outlive the stream's retention, and ReplayOptions.Archive sends
// them back through the rules of every replay. Its content is evidence, as
// a stream's is: an envelope's "verified" is a claim, re-checked with the
// key on replay.
const (
	archiveRecordsFile  = "records.jsonl"
	archiveManifestFile = "manifest.json"
	archiveVersion      = 1
)

// ExportOptions say which records an export writes and where.
type ExportOptions struct {
	// Dir is the archive directory: created if missing, refused unless
	// empty (an export never mixes with another). Required.
	Dir string
	// Filter selects the records (its States default to open only).
	Filter Filter
	// Vhost names the broker's virtual host in the manifest.
	Vhost string
}

// Manifest describes an archive: what it holds and the digests it is
// checked against before a replay.
type Manifest struct {
	Version     int       `json:"version"`
	CreatedAt   time.Time `json:"created_at"`
	Vhost       string    `json:"vhost"`
	Quarantines []string  `json:"quarantines"`
	Filter      string    `json:"filter"`
	Count       int       `json:"count"`
	// SHA256 is the hex digest of records.jsonl as written.
	SHA256 string `json:"sha256"`
	// Records are the lines in order: each record's id and the digest of
	// its line (without the newline).
	Records []ManifestRecord `json:"records"`
}

// ManifestRecord is one line of an archive.
type ManifestRecord struct {
	ID     string `json:"id"`
	SHA256 string `json:"sha256"`
}

// Archive is an archive read back and checked (see ReadArchive).
type Archive struct {
	Dir      string
	Manifest Manifest
	Records  []*Record
}

// archiveLine is one line of records.jsonl.
type archiveLine struct {
	ID         string          `json:"id"`
	Queue      string          `json:"queue"`
	Intake     string          `json:"intake"`
	StoredAt   time.Time       `json:"stored_at"`
	State      State           `json:"state"`
	Envelope   Envelope        `json:"envelope"`
	Properties Properties      `json:"properties"`
	Exchange   string          `json:"intake_exchange"`
	RoutingKey string          `json:"intake_routing_key"`
	Redrives   int             `json:"redrive_count"`
	Version    string          `json:"version_header,omitempty"`
	Headers    json.RawMessage `json:"headers"`
	Payload    []byte          `json:"payload_base64"`
}

// Export writes the records opts.Filter selects to a new archive in
// opts.Dir. It holds one payload at a time: the snapshot is read without
// payloads and each record's is read from the stream as its line is
// written. Both files are fsynced, and the directory, before it returns;
// the manifest is written last, so an export cut short leaves no manifest
// and its archive is refused.
func (in *Inspector) Export(ctx context.Context, opts ExportOptions) (*Manifest, error) {
	if opts.Dir == "" {
		return nil, errors.New("export: no directory")
	}
	if err := emptyDir(opts.Dir); err != nil {
		return nil, err
	}
	reader := *in
	reader.OmitBodies = true
	snap, err := reader.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	m := &Manifest{Version: archiveVersion, CreatedAt: in.now().UTC(), Vhost: opts.Vhost,
		Filter: opts.Filter.String(), Records: []ManifestRecord{}, Quarantines: []string{}}
	for _, s := range in.quarantines() {
		m.Quarantines = append(m.Quarantines, s.cfg.Quarantine.Queue)
	}
	f, err := os.OpenFile(filepath.Join(opts.Dir, archiveRecordsFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	defer f.Close()
	whole := sha256.New()
	w := bufio.NewWriter(io.MultiWriter(f, whole))
	for _, r := range snap.List(opts.Filter) {
		body, err := reader.ReadBody(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("export %s: %w", r.ID, err)
		}
		line, err := json.Marshal(archiveLine{
			ID: r.ID, Queue: r.Queue, Intake: r.Intake, StoredAt: r.StoredAt, State: r.State, Envelope: r.Envelope,
			Properties: r.Properties, Exchange: r.Exchange, RoutingKey: r.RoutingKey, Redrives: r.Redrives,
			Version: r.version, Headers: r.rawHeaders, Payload: body,
		})
		if err != nil {
			return nil, fmt.Errorf("export %s: %w", r.ID, err)
		}
		sum := sha256.Sum256(line)
		m.Records = append(m.Records, ManifestRecord{ID: r.ID, SHA256: hex.EncodeToString(sum[:])})
		if _, err := w.Write(append(line, '\n')); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("export: fsync: %w", err)
	}
	m.Count, m.SHA256 = len(m.Records), hex.EncodeToString(whole.Sum(nil))
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeSynced(filepath.Join(opts.Dir, archiveManifestFile), append(b, '\n')); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if err := syncDir(opts.Dir); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	return m, nil
}

// emptyDir creates dir, or checks that it exists and is empty.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("export: refused: %s is not empty (%d entries); an archive is written to an empty directory", dir, len(entries))
	}
	return nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ErrArchive: an archive that does not match its manifest (or has none).
// Nothing in it is replayed.
var ErrArchive = errors.New("refused: archive does not match its manifest")

// ReadArchive reads the archive in dir and checks every line against the
// manifest's digest (in order, by id) and the file against its digest:
// any mismatch is refused, naming the line's record. It checks digests,
// not who wrote them: an envelope's "verified" is cleared, and a replay
// with the key verifies each envelope again from the headers and payload.
// Each record's work queue is chosen from the config as for a record read
// from the stream, never taken from the archive.
func (in *Inspector) ReadArchive(dir string) (*Archive, error) {
	mb, err := os.ReadFile(filepath.Join(dir, archiveManifestFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrArchive, err)
	}
	a := &Archive{Dir: dir}
	if err := json.Unmarshal(mb, &a.Manifest); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrArchive, err)
	}
	m := &a.Manifest
	if m.Version != archiveVersion {
		return nil, fmt.Errorf("%w: manifest version %d, this version reads %d", ErrArchive, m.Version, archiveVersion)
	}
	data, err := os.ReadFile(filepath.Join(dir, archiveRecordsFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrArchive, err)
	}
	sets := map[string]*quarantineSet{}
	for _, s := range in.quarantines() {
		sets[s.cfg.Quarantine.Queue] = s
	}
	n := 0
	for rest := data; len(rest) > 0; n++ {
		line, tail, found := bytes.Cut(rest, []byte{'\n'})
		if !found {
			return nil, fmt.Errorf("%w: line %d has no newline (a cut file)", ErrArchive, n+1)
		}
		rest = tail
		if n >= len(m.Records) {
			return nil, fmt.Errorf("%w: line %d is not in the manifest (it lists %d)", ErrArchive, n+1, len(m.Records))
		}
		want := m.Records[n]
		sum := sha256.Sum256(line)
		if hex.EncodeToString(sum[:]) != want.SHA256 {
			return nil, fmt.Errorf("%w: line %d (record %s): its digest is not the manifest's", ErrArchive, n+1, want.ID)
		}
		var l archiveLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("%w: line %d (record %s): %v", ErrArchive, n+1, want.ID, err)
		}
		if l.ID != want.ID {
			return nil, fmt.Errorf("%w: line %d is record %s, the manifest says %s", ErrArchive, n+1, l.ID, want.ID)
		}
		s, ok := sets[l.Intake]
		if !ok {
			return nil, fmt.Errorf("%w: record %s: quarantine %q is not in the config", ErrArchive, l.ID, l.Intake)
		}
		env := l.Envelope
		env.Verified = false // a claim in a file; the replay verifies with the key
		r := &Record{ID: l.ID, Intake: l.Intake, Offset: -1, StoredAt: l.StoredAt, State: l.State, Envelope: env,
			Properties: l.Properties, Exchange: l.Exchange, RoutingKey: l.RoutingKey, Body: l.Payload,
			rawHeaders: l.Headers, version: l.Version}
		// A lowered count would buy redrives past the budget: without a key
		// the higher of the line's and the headers' count is the prior.
		r.Redrives = max(l.Redrives, redrives(r.Headers()), 0)
		r.Queue, r.Owner = ownerOf(r, s)
		a.Records = append(a.Records, r)
	}
	if n != len(m.Records) || n != m.Count {
		return nil, fmt.Errorf("%w: %d line(s), the manifest lists %d and counts %d", ErrArchive, n, len(m.Records), m.Count)
	}
	whole := sha256.Sum256(data)
	if hex.EncodeToString(whole[:]) != m.SHA256 {
		return nil, fmt.Errorf("%w: %s's digest is not the manifest's", ErrArchive, archiveRecordsFile)
	}
	return a, nil
}
