package postgres

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// cursorPrefix versions the cursor format. A cursor is
//
//	v1:<updated_at as microseconds since the Unix epoch>:<id as text>
//
// The id is last, so it may contain ':'. Microseconds are exact: a page
// boundary between rows that differ only in the sixth decimal survives the
// round trip through the checkpoint.
const cursorPrefix = "v1:"

// key is a position in the (updated_at, id) total order.
type key struct {
	micros int64
	id     string
}

func (k key) cursor() string {
	return cursorPrefix + strconv.FormatInt(k.micros, 10) + ":" + k.id
}

func (k key) time() time.Time { return schemas.FromMicros(k.micros) }

// decodeCursor parses a cursor made by key.cursor, strictly: anything else
// is an error that names the cursor, since it most likely comes from a
// checkpoint written for another source.
func decodeCursor(c string, idKind idKind) (key, error) {
	bad := func(why string) (key, error) {
		return key{}, badCheckpoint(fmt.Errorf("cursor %q from the checkpoint is not a PostgreSQL-source cursor (%s); it was written by another source or corrupted", c, why))
	}
	rest, ok := strings.CutPrefix(c, cursorPrefix)
	if !ok {
		return bad("want prefix " + cursorPrefix)
	}
	ts, id, ok := strings.Cut(rest, ":")
	if !ok {
		return bad("missing id")
	}
	us, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || strconv.FormatInt(us, 10) != ts {
		return bad("timestamp is not canonical integer microseconds")
	}
	if err := idKind.validate(id); err != nil {
		return bad(err.Error())
	}
	return key{micros: us, id: id}, nil
}

// badCheckpoint is a safety stop for a cursor or key range the checkpoint
// holds that this table cannot use: a retry reads the same checkpoint, so
// it would fail the same way for ever (docs/design.md, "Safety stops").
func badCheckpoint(err error) error {
	return &connector.StopError{
		Reason:   "the checkpoint's position does not fit the source table",
		Hint:     "the id column's type may have changed, or the checkpoint was written for another table or source; inspect it with `tidemark status`, then `tidemark reset` (which publishes every row again) rather than guess a position",
		Err:      err,
		Unmarked: true, // the checkpoint is what is in question: write nothing into it
	}
}

// idKind is the id column's type, from the whitelist in docs/design.md, "Source table requirements". It
// picks the SQL cast applied to the cursor's id text; the cast name comes
// from this list, never from configuration.
type idKind uint8

const (
	idInvalid idKind = iota
	idBigint
	idInteger
	idSmallint
	idText
	idVarchar
	idUUID
)

func idKindOf(base uint32) idKind {
	switch base {
	case oidInt8:
		return idBigint
	case oidInt4:
		return idInteger
	case oidInt2:
		return idSmallint
	case oidText:
		return idText
	case oidVarchar:
		return idVarchar
	case oidUUID:
		return idUUID
	}
	return idInvalid
}

// sqlType is the cast target for the cursor parameter.
func (k idKind) sqlType() string {
	switch k {
	case idBigint:
		return "bigint"
	case idInteger:
		return "integer"
	case idSmallint:
		return "smallint"
	case idVarchar:
		return "varchar"
	case idUUID:
		return "uuid"
	}
	return "text"
}

// zero is a valid id of this kind, for EXPLAIN parameters.
func (k idKind) zero() string {
	switch k {
	case idBigint, idInteger, idSmallint:
		return "0"
	case idUUID:
		return "00000000-0000-0000-0000-000000000000"
	}
	return ""
}

func (k idKind) validate(id string) error {
	bits := 0
	switch k {
	case idBigint:
		bits = 64
	case idInteger:
		bits = 32
	case idSmallint:
		bits = 16
	case idUUID:
		if len(id) != 36 {
			return fmt.Errorf("id %q is not a uuid", id)
		}
		for i := 0; i < len(id); i++ {
			c := id[i]
			if i == 8 || i == 13 || i == 18 || i == 23 {
				if c != '-' {
					return fmt.Errorf("id %q is not a uuid", id)
				}
			} else if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return fmt.Errorf("id %q is not a lowercase uuid", id)
			}
		}
		return nil
	default:
		return nil
	}
	n, err := strconv.ParseInt(id, 10, bits)
	if err != nil || strconv.FormatInt(n, 10) != id {
		return fmt.Errorf("id %q is not a canonical %d-bit integer", id, bits)
	}
	return nil
}
