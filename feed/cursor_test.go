package feed

import (
	"encoding/base64"
	"testing"
	"time"
)

func b64(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
func enc(b []byte) string          { return base64.RawURLEncoding.EncodeToString(b) }

func TestCursorRoundTripMicroseconds(t *testing.T) {
	fp := Fingerprint("public.items", "", "")
	for _, c := range []Cursor{
		{Fingerprint: fp, Issued: t0, UpdatedAt: t0.Add(time.Microsecond), ID: "a"},
		{Fingerprint: fp, Issued: t0, UpdatedAt: t0.Add(999999 * time.Microsecond), ID: "id:with:colons|and|bars"},
		{Fingerprint: fp, Issued: t0, UpdatedAt: time.UnixMicro(-1).UTC(), ID: ""},
		{Fingerprint: fp, Issued: t0, UpdatedAt: t0, ID: "ünïcode ✓"},
	} {
		s := EncodeCursor(testKey, c)
		got, err := DecodeCursor(testKey, s)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if !got.UpdatedAt.Equal(c.UpdatedAt) || got.ID != c.ID || got.Fingerprint != c.Fingerprint || !got.Issued.Equal(c.Issued) {
			t.Errorf("round trip: %+v -> %+v", c, got)
		}
	}
	if Fingerprint("a", "bc", "") == Fingerprint("ab", "c", "") {
		t.Error("fingerprint fields are not separated")
	}
}

// FuzzDecodeCursor: no input panics; whatever decodes is canonical (it
// re-encodes to the same text), so two spellings never name one position.
// Seeds live in testdata/fuzz/FuzzDecodeCursor and run under plain go test.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(EncodeCursor(testKey, Cursor{Fingerprint: Fingerprint("public.items", "", ""), Issued: t0, UpdatedAt: t0, ID: "k1"}))
	f.Fuzz(func(t *testing.T, s string) {
		c, err := DecodeCursor(testKey, s)
		if err != nil {
			if err.Status != 400 || err.Code == "" {
				t.Fatalf("error %+v", err)
			}
			return
		}
		if again := EncodeCursor(testKey, c); again != s {
			t.Fatalf("decoded %q re-encodes as %q", s, again)
		}
	})
}

// A cursor has one spelling: Go's base64 decoder skips '\r' and '\n' even
// in strict mode, so a cursor with an inserted line break must still be
// refused (invalid_cursor), as must any byte outside base64url.
func TestCursorOneSpelling(t *testing.T) {
	good := EncodeCursor(testKey, Cursor{Fingerprint: Fingerprint("public.items", "", ""), Issued: t0, UpdatedAt: t0, ID: "k1"})
	if _, err := DecodeCursor(testKey, good); err != nil {
		t.Fatal(err)
	}
	for _, ins := range []string{"\n", "\r", "\r\n", " ", "=", "+", "/", "\t", "\x00"} {
		for _, at := range []int{0, 1, len(good) / 2, len(good)} {
			s := good[:at] + ins + good[at:]
			if _, err := DecodeCursor(testKey, s); err == nil || err.Code != CodeInvalidCursor {
				t.Errorf("%q inserted at %d: got %v, want %s", ins, at, err, CodeInvalidCursor)
			}
		}
	}
}
