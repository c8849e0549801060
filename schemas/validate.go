package schemas

import (
	"bytes"
	"embed"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Kind names one of tidemark's wire formats.
type Kind string

// The formats with a JSON Schema.
const (
	// KindValue is the value of an upsert record: a JSON object of the row's
	// columns (value.schema.json).
	KindValue Kind = "value"
	// KindHeaders is a record's headers as a JSON object of header key to
	// text value (headers.schema.json).
	KindHeaders Kind = "headers"
	// KindCheckpoint is a checkpoint as written by EncodeCheckpoint
	// (checkpoint.schema.json).
	KindCheckpoint Kind = "checkpoint"
	// KindLedger is a ledger entry as written by EncodeLedgerEntry
	// (ledger.schema.json).
	KindLedger Kind = "ledger"
)

// Kinds lists every Kind.
func Kinds() []Kind { return []Kind{KindValue, KindHeaders, KindCheckpoint, KindLedger} }

//go:embed value.schema.json headers.schema.json checkpoint.schema.json ledger.schema.json
var schemaFS embed.FS

// Schema returns the JSON Schema document of kind, as embedded, or nil for
// an unknown kind.
func Schema(kind Kind) []byte {
	b, err := schemaFS.ReadFile(string(kind) + ".schema.json")
	if err != nil {
		return nil
	}
	return b
}

// compiled holds the schemas, compiled once on first use.
var compiled = sync.OnceValues(func() (map[Kind]*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	ids := map[Kind]string{}
	for _, k := range Kinds() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schema(k)))
		if err != nil {
			return nil, fmt.Errorf("%s.schema.json: %w", k, err)
		}
		id, _ := doc.(map[string]any)["$id"].(string)
		if id == "" {
			return nil, fmt.Errorf("%s.schema.json has no $id", k)
		}
		if err := c.AddResource(id, doc); err != nil {
			return nil, fmt.Errorf("%s.schema.json: %w", k, err)
		}
		ids[k] = id
	}
	out := make(map[Kind]*jsonschema.Schema, len(ids))
	for k, id := range ids {
		s, err := c.Compile(id)
		if err != nil {
			return nil, fmt.Errorf("compile %s.schema.json: %w", k, err)
		}
		out[k] = s
	}
	return out, nil
})

// Validate checks doc, a JSON document, against the schema of kind. The
// error says where doc breaks the schema.
func Validate(kind Kind, doc []byte) error {
	schemas, err := compiled()
	if err != nil {
		return err // a broken embedded schema: a bug in this build
	}
	s, ok := schemas[kind]
	if !ok {
		return fmt.Errorf("validate: unknown schema kind %q", kind)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("%s is not valid JSON: %w", kind, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s does not match %s.schema.json: %w", kind, kind, err)
	}
	return nil
}
