package schemas_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/schemas"
)

func realCheckpoint() *schemas.Checkpoint {
	ts := schemas.FormatTime(time.Date(2024, 5, 1, 12, 0, 0, 1000, time.UTC))
	return &schemas.Checkpoint{
		Version:           schemas.CheckpointVersion,
		Connector:         "orders-sync",
		Fingerprint:       "0123456789abcdef0123456789abcdef",
		FingerprintFields: map[string]string{"source.table": "orders", "name": "orders-sync"},
		Phase:             schemas.PhasePass,
		Watermark:         ts,
		PassLow:           schemas.FormatTime(time.Date(2024, 5, 1, 11, 59, 50, 1000, time.UTC)),
		PassMax:           ts,
		PassHorizon:       "",
		Cursor:            `opaque:{"ts":"x","id":"42"}`,
		Boundary: schemas.BoundaryState{
			Floor:   schemas.FormatTime(time.Date(2024, 5, 1, 11, 59, 50, 1000, time.UTC)),
			Entries: 3,
			Units:   []schemas.BoundaryUnit{{Seq: 5, Offsets: []int64{12, 13}, Entries: 40000}, {Seq: 7, Offsets: []int64{20}, Entries: 2}},
		},
		SeenMark:    "x1:1234",
		PassMark:    "x1:1240",
		RunID:       "run-1",
		Seq:         7,
		Counters:    schemas.Counters{Raw: 10, Published: 8, Deduped: 2, Tombstones: 1, Transactions: 7, Pages: 9, Passes: 1},
		CommittedAt: ts,
	}
}

func encode(t *testing.T, c *schemas.Checkpoint) []byte {
	t.Helper()
	b, err := schemas.EncodeCheckpoint(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCheckpointValid(t *testing.T) {
	for name, mod := range map[string]func(c *schemas.Checkpoint){
		"pass": func(c *schemas.Checkpoint) {},
		"initial": func(c *schemas.Checkpoint) {
			*c = schemas.Checkpoint{Version: schemas.CheckpointVersion, Connector: "c", Fingerprint: strings.Repeat("0", 32), Phase: schemas.PhaseIdle}
		},
		"snapshot": func(c *schemas.Checkpoint) { c.Phase = schemas.PhaseSnapshot; c.Boundary = schemas.BoundaryState{} },
		"load": func(c *schemas.Checkpoint) {
			c.Phase, c.Watermark = schemas.PhaseLoad, ""
			c.Load = &schemas.Load{Consistent: true, Ranges: []schemas.LoadRange{{Hi: "250000", Cursor: "1200", Done: false}, {Lo: "250000", Hi: "", Done: true}}}
		},
		"decision": func(c *schemas.Checkpoint) { c.NeedsDecision = "fingerprint changed" },
		"reset": func(c *schemas.Checkpoint) {
			c.LastReset = &schemas.Reset{At: c.CommittedAt, By: "ops@host", Reason: "table rebuilt", Watermark: ""}
		},
		"reset to watermark": func(c *schemas.Checkpoint) {
			c.LastReset = &schemas.Reset{At: c.CommittedAt, By: "ops@host", Watermark: c.Watermark}
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := realCheckpoint()
			mod(c)
			b := encode(t, c)
			if err := schemas.Validate(schemas.KindCheckpoint, b); err != nil {
				t.Fatalf("real checkpoint rejected: %v\n%s", err, b)
			}
			if _, err := schemas.DecodeCheckpoint(b); err != nil {
				t.Fatalf("decode: %v", err)
			}
		})
	}
}

// edit decodes a valid checkpoint into a generic map, applies f and encodes
// it again, to forge documents the Go type cannot produce.
func edit(t *testing.T, f func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(encode(t, realCheckpoint()), &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCheckpointInvalid(t *testing.T) {
	for name, tc := range map[string]struct {
		doc  []byte
		want string // part of the error, naming the offending location
	}{
		"version 4":                 {edit(t, func(m map[string]any) { m["version"] = 4 }), "/version"},
		"version 3 without a load":  {edit(t, func(m map[string]any) { m["version"] = 3 }), "/version"},
		"phase load without a load": {edit(t, func(m map[string]any) { m["phase"], m["version"] = "load", 3 }), "load"},
		"a load in phase pass": {edit(t, func(m map[string]any) {
			m["load"] = map[string]any{"consistent": false, "ranges": []any{map[string]any{"lo": "", "hi": "", "cursor": "", "done": false}}}
		}), "load"},
		"a load without ranges": {edit(t, func(m map[string]any) {
			m["phase"], m["version"] = "load", 3
			m["load"] = map[string]any{"consistent": false, "ranges": []any{}}
		}), "/load/ranges"},
		"wrong phase":     {edit(t, func(m map[string]any) { m["phase"] = "running" }), "/phase"},
		"inline boundary": {edit(t, func(m map[string]any) { m["boundary"] = []any{[]any{"42", 1, "0000000000000000"}} }), "/boundary"},
		"bad floor":       {edit(t, func(m map[string]any) { m["boundary"].(map[string]any)["floor"] = "yesterday" }), "/boundary/floor"},
		"unit no offsets": {edit(t, func(m map[string]any) {
			m["boundary"].(map[string]any)["units"].([]any)[0].(map[string]any)["offsets"] = []any{}
		}), "/boundary/units/0/offsets"},
		"negative offset": {edit(t, func(m map[string]any) {
			m["boundary"].(map[string]any)["units"].([]any)[0].(map[string]any)["offsets"] = []any{-1}
		}), "/boundary/units/0/offsets/0"},
		"unit extra field": {edit(t, func(m map[string]any) { m["boundary"].(map[string]any)["units"].([]any)[0].(map[string]any)["x"] = 1 }), "/boundary/units/0"},
		"mark not string":  {edit(t, func(m map[string]any) { m["seen_mark"] = 5 }), "/seen_mark"},
		"second timestamp": {edit(t, func(m map[string]any) { m["watermark"] = "2024-05-01T12:00:00Z" }), "/watermark"},
		"nanos timestamp":  {edit(t, func(m map[string]any) { m["pass_low"] = "2024-05-01T12:00:00.000000001Z" }), "/pass_low"},
		"offset timestamp": {edit(t, func(m map[string]any) { m["pass_max"] = "2024-05-01T12:00:00.000001+02:00" }), "/pass_max"},
		"missing field":    {edit(t, func(m map[string]any) { delete(m, "cursor") }), "cursor"},
		"unknown field":    {edit(t, func(m map[string]any) { m["extra"] = 1 }), "extra"},
		"short fp":         {edit(t, func(m map[string]any) { m["fingerprint"] = "abc" }), "/fingerprint"},
		"negative seq":     {edit(t, func(m map[string]any) { m["seq"] = -1 }), "/seq"},
		"counter missing":  {edit(t, func(m map[string]any) { delete(m["counters"].(map[string]any), "raw") }), "/counters"},
		"fields non-str":   {edit(t, func(m map[string]any) { m["fingerprint_fields"].(map[string]any)["x"] = 1 }), "/fingerprint_fields/x"},
		"empty decision":   {edit(t, func(m map[string]any) { m["needs_decision"] = "" }), "/needs_decision"},
		"not an object":    {[]byte(`[1,2]`), "object"},
		"not json":         {[]byte(`{"version":`), "not valid JSON"},
	} {
		t.Run(name, func(t *testing.T) {
			err := schemas.Validate(schemas.KindCheckpoint, tc.doc)
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.doc)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not mention %q: %v", tc.want, err)
			}
		})
	}
}

// TestCheckpointSchemaMatchesGoType keeps checkpoint.schema.json in step
// with schemas.Checkpoint: the same properties, the same required set
// (every field without omitempty).
func TestCheckpointSchemaMatchesGoType(t *testing.T) {
	var doc struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
		Defs       map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(schemas.Schema(schemas.KindCheckpoint), &doc); err != nil {
		t.Fatal(err)
	}
	check := func(what string, typ reflect.Type, props map[string]json.RawMessage, required []string) {
		t.Helper()
		var names, req []string
		for i := range typ.NumField() {
			tag := typ.Field(i).Tag.Get("json")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "-" {
				continue // never written
			}
			names = append(names, name)
			if !strings.Contains(opts, "omitempty") {
				req = append(req, name)
			}
		}
		var got []string
		for k := range props {
			got = append(got, k)
		}
		slices.Sort(names)
		slices.Sort(got)
		slices.Sort(req)
		required = slices.Sorted(slices.Values(required))
		if !slices.Equal(names, got) {
			t.Errorf("%s: Go fields %v, schema properties %v; update checkpoint.schema.json (and its version if readers must notice)", what, names, got)
		}
		if !slices.Equal(req, required) {
			t.Errorf("%s: Go required fields %v, schema required %v", what, req, required)
		}
	}
	check("Checkpoint", reflect.TypeFor[schemas.Checkpoint](), doc.Properties, doc.Required)
	check("Counters", reflect.TypeFor[schemas.Counters](), doc.Defs["counters"].Properties, doc.Defs["counters"].Required)
	check("BoundaryState", reflect.TypeFor[schemas.BoundaryState](), doc.Defs["boundary"].Properties, doc.Defs["boundary"].Required)
	check("BoundaryUnit", reflect.TypeFor[schemas.BoundaryUnit](), doc.Defs["boundaryUnit"].Properties, doc.Defs["boundaryUnit"].Required)
	var reset struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if err := json.Unmarshal(doc.Properties["last_reset"], &reset); err != nil {
		t.Fatal(err)
	}
	check("Reset", reflect.TypeFor[schemas.Reset](), reset.Properties, reset.Required)
}

func TestHeaders(t *testing.T) {
	ts := schemas.FormatTime(time.Date(2024, 5, 1, 12, 0, 0, 123456000, time.UTC))
	good := []map[string]string{
		{schemas.HeaderOperation: schemas.OpUpsert, schemas.HeaderUpdatedAt: ts, schemas.HeaderConnector: "c"},
		{schemas.HeaderOperation: schemas.OpDelete, schemas.HeaderUpdatedAt: "0001-01-01T00:00:00.000000Z", schemas.HeaderConnector: "orders-sync"},
	}
	for _, h := range good {
		b, _ := json.Marshal(h)
		if err := schemas.Validate(schemas.KindHeaders, b); err != nil {
			t.Errorf("%s rejected: %v", b, err)
		}
	}
	for name, h := range map[string]map[string]any{
		"operation":       {"operation": "insert", "updated_at": ts, "connector": "c"},
		"no operation":    {"updated_at": ts, "connector": "c"},
		"seconds only":    {"operation": "upsert", "updated_at": "2024-05-01T12:00:00Z", "connector": "c"},
		"millis":          {"operation": "upsert", "updated_at": "2024-05-01T12:00:00.123Z", "connector": "c"},
		"nanos":           {"operation": "upsert", "updated_at": "2024-05-01T12:00:00.123456789Z", "connector": "c"},
		"offset":          {"operation": "upsert", "updated_at": "2024-05-01T12:00:00.123456+00:00", "connector": "c"},
		"space":           {"operation": "upsert", "updated_at": "2024-05-01 12:00:00.123456Z", "connector": "c"},
		"month 13":        {"operation": "upsert", "updated_at": "2024-13-01T12:00:00.123456Z", "connector": "c"},
		"trailing":        {"operation": "upsert", "updated_at": ts + "x", "connector": "c"},
		"empty connector": {"operation": "upsert", "updated_at": ts, "connector": ""},
		"no connector":    {"operation": "upsert", "updated_at": ts},
		"extra header":    {"operation": "upsert", "updated_at": ts, "connector": "c", "x": "y"},
		"non-string":      {"operation": "upsert", "updated_at": 5, "connector": "c"},
	} {
		b, _ := json.Marshal(h)
		if err := schemas.Validate(schemas.KindHeaders, b); err == nil {
			t.Errorf("%s: %s accepted", name, b)
		}
	}
}

func TestValue(t *testing.T) {
	good := []string{
		`{}`,
		`{"id":42,"name":"x","price":"12.50","at":"2024-05-01T12:00:00.000001Z","doc":{"a":[1,null]},"raw":"AAEC","tags":["a","b"],"gone":null,"f":"NaN","ok":true}`,
	}
	for _, doc := range good {
		if err := schemas.Validate(schemas.KindValue, []byte(doc)); err != nil {
			t.Errorf("%s rejected: %v", doc, err)
		}
	}
	for _, doc := range []string{`null`, `[]`, `"x"`, `42`, `[{"id":1}]`, `{"id":}`} {
		if err := schemas.Validate(schemas.KindValue, []byte(doc)); err == nil {
			t.Errorf("%s accepted", doc)
		}
	}
}

func TestSchemaDocuments(t *testing.T) {
	for _, k := range schemas.Kinds() {
		var doc map[string]any
		if err := json.Unmarshal(schemas.Schema(k), &doc); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if doc["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $schema %v", k, doc["$schema"])
		}
		version := map[schemas.Kind]int{schemas.KindCheckpoint: schemas.CheckpointVersion, schemas.KindLedger: schemas.LedgerVersion}[k]
		if want := fmt.Sprintf("https://tidemark.dev/schemas/%s/v%d.json", k, max(version, 1)); doc["$id"] != want {
			t.Errorf("%s: $id %v, want %s", k, doc["$id"], want)
		}
		if d, _ := doc["description"].(string); d == "" {
			t.Errorf("%s: no description", k)
		}
	}
	if schemas.Schema("nope") != nil {
		t.Error("Schema of an unknown kind")
	}
	if err := schemas.Validate("nope", []byte(`{}`)); err == nil {
		t.Error("Validate of an unknown kind succeeded")
	}
}

// TestValueDefs checks the encodings documented in value.schema.json's $defs
// against values written the way tidemark writes them.
func TestValueDefs(t *testing.T) {
	var doc struct {
		Defs map[string]struct {
			Pattern string `json:"pattern"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(schemas.Schema(schemas.KindValue), &doc); err != nil {
		t.Fatal(err)
	}
	for def, samples := range map[string][]string{
		"timestamp": {schemas.FormatTime(time.Now()), "infinity", "-infinity"},
		"numeric":   {"12.50", "-3", "0.000001", "NaN", "Infinity", "-Infinity"},
		"uuid":      {"123e4567-e89b-12d3-a456-426614174000"},
	} {
		re := doc.Defs[def].Pattern
		if re == "" {
			t.Fatalf("$defs/%s has no pattern", def)
		}
		for _, s := range samples {
			if !regexp.MustCompile(re).MatchString(s) {
				t.Errorf("$defs/%s pattern %s rejects %q", def, re, s)
			}
		}
	}
}

func TestLedger(t *testing.T) {
	ts := schemas.FormatTime(time.Date(2024, 5, 1, 12, 0, 0, 1000, time.UTC))
	counters := schemas.Counters{Raw: 3, Published: 2, Deduped: 1, Transactions: 1, Pages: 1}
	good := map[string]*schemas.LedgerEntry{
		"run": {Version: schemas.LedgerVersion, Connector: "c", Kind: schemas.LedgerRun, RunID: "r1", Seq: 0, At: ts,
			Reason: schemas.ReasonFresh, Detail: "no checkpoint", Phase: schemas.PhaseIdle, Counters: counters},
		"txn": {Version: schemas.LedgerVersion, Connector: "c", Kind: schemas.LedgerTxn, RunID: "r1", Seq: 1, At: ts,
			Phase: schemas.PhasePass, RequestCursor: "", NextCursor: "cur2", Watermark: ts, Pages: 1, Raw: 3,
			Published: 2, Deduped: 1, Keys: 2, KeysDigest: "00000000deadbeef", Counters: counters},
		"reset": {Version: schemas.LedgerVersion, Connector: "c", Kind: schemas.LedgerReset, RunID: schemas.ResetRunID,
			Seq: 2, At: ts, Watermark: "", Counters: counters, By: "ops@host", Why: "table rebuilt"},
	}
	for name, e := range good {
		b, err := schemas.EncodeLedgerEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		if err := schemas.Validate(schemas.KindLedger, b); err != nil {
			t.Errorf("%s: real entry rejected: %v\n%s", name, err, b)
		}
	}
	bad := map[string]func(e *schemas.LedgerEntry){
		"version 3":   func(e *schemas.LedgerEntry) { e.Version = 3 },
		"kind":        func(e *schemas.LedgerEntry) { e.Kind = "commit" },
		"reason":      func(e *schemas.LedgerEntry) { e.Reason = "because" },
		"at":          func(e *schemas.LedgerEntry) { e.At = "" },
		"keys digest": func(e *schemas.LedgerEntry) { e.KeysDigest = "abc" },
		"watermark":   func(e *schemas.LedgerEntry) { e.Watermark = "yesterday" },
		"negative":    func(e *schemas.LedgerEntry) { e.Raw = -1 },
		"counters":    func(e *schemas.LedgerEntry) { e.Counters.Pages = -1 },
	}
	for name, f := range bad {
		e := *good["txn"]
		f(&e)
		b, _ := schemas.EncodeLedgerEntry(&e)
		if err := schemas.Validate(schemas.KindLedger, b); err == nil {
			t.Errorf("%s: accepted %s", name, b)
		}
	}
}

// TestLedgerSchemaMatchesGoType keeps ledger.schema.json in step with
// schemas.LedgerEntry.
func TestLedgerSchemaMatchesGoType(t *testing.T) {
	var doc struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if err := json.Unmarshal(schemas.Schema(schemas.KindLedger), &doc); err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeFor[schemas.LedgerEntry]()
	var names, req []string
	for i := range typ.NumField() {
		name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		names = append(names, name)
		if !strings.Contains(opts, "omitempty") {
			req = append(req, name)
		}
	}
	props := slices.Sorted(maps.Keys(doc.Properties))
	slices.Sort(names)
	slices.Sort(req)
	if !slices.Equal(names, props) {
		t.Errorf("Go fields %v, schema properties %v; update ledger.schema.json", names, props)
	}
	if got := slices.Sorted(slices.Values(doc.Required)); !slices.Equal(req, got) {
		t.Errorf("Go required fields %v, schema required %v", req, got)
	}
}

// A checkpoint with an open load in key order is written as version 3, so
// that a build that does not know a load refuses it; this build reads it
// back whole, and refuses a version that does not go with its phase.
func TestCheckpointLoadVersion(t *testing.T) {
	c := realCheckpoint()
	c.Phase, c.Watermark = schemas.PhaseLoad, ""
	c.Load = &schemas.Load{Ranges: []schemas.LoadRange{{Hi: "9", Cursor: "4"}, {Lo: "9", Done: true}}}
	b, err := schemas.EncodeCheckpoint(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"version":3`) {
		t.Fatalf("a load checkpoint is not written as version 3: %s", b)
	}
	got, err := schemas.DecodeCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != schemas.CheckpointVersion || got.Load == nil || len(got.Load.Ranges) != 2 || got.Load.Ranges[0].Cursor != "4" || !got.Load.Ranges[1].Done {
		t.Fatalf("read back %+v, load %+v", got, got.Load)
	}
	for name, doc := range map[string]string{
		"version 3, phase pass":    strings.Replace(string(b), `"phase":"load"`, `"phase":"pass"`, 1),
		"version 2, phase load":    strings.Replace(string(b), `"version":3`, `"version":2`, 1),
		"version 3 without a load": strings.Replace(strings.Replace(string(b), `"phase":"load"`, `"phase":"pass"`, 1), `"load":`, `"x":`, 1),
	} {
		if _, err := schemas.DecodeCheckpoint([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
