package schemas

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/internal/jsonscan"
)

// stdDecode is the reference: encoding/json with UseNumber.
func stdDecode(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, bytes.ErrTooLarge // any error: trailing data
	}
	return v, nil
}

// checkAgainstStd is the decoder's contract, relative to encoding/json:
// whatever it accepts, encoding/json decodes to the same value; whatever
// encoding/json rejects, it rejects; its only extra rejections are the
// documented ones, never plain syntax.
func checkAgainstStd(t *testing.T, data []byte) {
	t.Helper()
	got, derr := decodeJSON(data)
	valid := json.Valid(data)
	switch {
	case derr == nil && !valid:
		t.Fatalf("%q: decoded, but encoding/json says it is not JSON", data)
	case derr == nil:
		want, err := stdDecode(data)
		if err != nil {
			t.Fatalf("%q: decoded, encoding/json failed: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: got %#v, encoding/json %#v", data, got, want)
		}
	case derr.Syntax && valid:
		t.Fatalf("%q: syntax error %v, but encoding/json accepts it", data, derr)
	case !derr.Syntax && valid && utf8.Valid(data) && !strings.Contains(derr.Msg, "duplicate") &&
		!strings.Contains(derr.Msg, "nesting") && !strings.Contains(derr.Msg, "number") && !strings.Contains(derr.Msg, "surrogate"):
		t.Fatalf("%q: unexpected rejection %v", data, derr)
	}
}

func TestDecodeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range decodeSeeds {
		checkAgainstStd(t, []byte(s))
	}
}

var decodeSeeds = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `-1.5e+10`, `1E-2`, `"x"`, ` {"a" : [1, 2, {"b": null}] } `,
	`"\u00e9\ud83d\ude00\n\t\"\\\/\b\f\r"`, `"é😀"`, `{"a":1,"b":{"a":2}}`, `[[[[]]]]`,
	`123456789012345678901234567890`, `0.1000000000000000000000000000001`,
	// errors
	``, ` `, `{`, `[1,]`, `{"a":1,}`, `{"a"}`, `{"a":1 "b":2}`, `01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`,
	`tru`, `nul`, `"abc`, `"\x"`, `"\u12"`, `"\u12zz"`, "\"a\x01\"", `[1] [2]`, `{"a":1}}`, "\xef\xbb\xbf{}",
	// the decoder's own rejections
	`{"a":1,"a":2}`, `{"x":{"a":1,"a":2}}`, "\"\xff\"", "\"\xc3\x28\"", `"\ud800"`, `"\udc00\ud800"`, `"\ud800\u0041"`,
	`1e99999`, `-1e-1001`, strings.Repeat("1", 200), strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1),
	strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth),
}

func TestDecodeErrorPointer(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"a":1,"a":2}`:                        "/a",
		`{"x":[0,{"a/b":1,"a/b":2}]}`:          "/x/1/a~1b",
		`{"x":{"y":"\ud800"}}`:                 "/x/y",
		`[1,2,1e5000]`:                         "/2",
		`[[1,2,3],[4,5],[6,{"a":1,"a":2}]]`:    "/2/1/a",
		`{"a":1,"a"}`:                          "/a",
		`{"a":1,"a":}`:                         "/a",
		`{"a":1,"a":[1,}`:                      "/a",
		`{"a":1,"b":{"a":1,"a":"\ud800"}}`:     "/b/a",
		`{"note":"` + "\xff" + `"}`:            "/note",
		`{"d":` + strings.Repeat("[", 70) + ``: "/d/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0",
	} {
		_, err := decodeJSON([]byte(body))
		if err == nil || err.pointer() != want {
			t.Errorf("%s: pointer %q, want %q (%v)", body, err.pointer(), want, err)
		}
	}
}

// FuzzDecode checks the decoder against encoding/json on arbitrary bytes.
func FuzzDecode(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkAgainstStd(t, data) })
}

// checkScanner is the contract of the gate's tokenizer (jsonscan.Scanner), relative to encoding/json's
// Decoder reading a stream of values: it accepts exactly the same inputs,
// and yields the same tokens with the same values (strings as Text, other
// scalars as their bytes).
func checkScanner(t *testing.T, data []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stdErr error
	for {
		var v any
		if stdErr = dec.Decode(&v); stdErr != nil {
			break
		}
	}
	stdOK := stdErr == io.EOF

	sc := jsonscan.New(data)
	var toks []jsonscan.Token
	var texts []string
	for {
		tok, err := sc.Next()
		if err != nil {
			if stdOK {
				t.Fatalf("%q: scanner error %v, encoding/json reads it", data, err)
			}
			if _, again := sc.Next(); again == nil {
				t.Fatalf("%q: no error after the error %v", data, err)
			}
			return
		}
		if tok.Kind == jsonscan.EOF {
			if sc.Depth() != 0 {
				t.Fatalf("%q: EOF at depth %d", data, sc.Depth())
			}
			break
		}
		toks = append(toks, tok)
		texts = append(texts, string(sc.Text(tok)))
	}
	if !stdOK {
		t.Fatalf("%q: scanned, encoding/json says %v", data, stdErr)
	}
	tdec := json.NewDecoder(bytes.NewReader(data))
	tdec.UseNumber()
	for i, tok := range toks {
		want, err := tdec.Token()
		if err != nil {
			t.Fatalf("%q: token %d: encoding/json %v", data, i, err)
		}
		raw := string(data[tok.Start:tok.End])
		var got any
		switch tok.Kind {
		case jsonscan.BeginObject, jsonscan.EndObject, jsonscan.BeginArray, jsonscan.EndArray:
			got = json.Delim(raw[0])
		case jsonscan.Key, jsonscan.String:
			got = texts[i]
			if !utf8.ValidString(raw) { // encoding/json substitutes U+FFFD
				continue
			}
		case jsonscan.Number:
			got = json.Number(raw)
		case jsonscan.True, jsonscan.False:
			got = raw == "true"
		case jsonscan.Null:
			got = nil
		}
		if got != want {
			t.Fatalf("%q: token %d (%s) = %#v, encoding/json %#v", data, i, raw, got, want)
		}
	}
}

func TestScannerMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range append(decodeSeeds, scannerSeeds...) {
		checkScanner(t, []byte(s))
	}
}

var scannerSeeds = []string{
	`1 2`, `01`, `1true`, `{}{}`, `"a""b"`, `[1] [2]`, `{"a":1} x`, `{"a":1,"a":2}`, `"\ud800\u0041"`, `"\udc00"`,
	"\"\xff\"", `1e99999`, strings.Repeat("[", 200) + strings.Repeat("]", 200), ` `, `{"a" 1}`, `[1 2]`, `{"a":1 "b":2}`,
}

// FuzzScanner checks the Scanner against encoding/json on arbitrary bytes.
func FuzzScanner(f *testing.F) {
	for _, s := range append(decodeSeeds, scannerSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkScanner(t, data) })
}
