package httpsrc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// paths are the configured JSON paths, split into keys.
type paths struct {
	items, id, updatedAt, deleted, deletedAt, value, next, hasMore, errCode []string
	// raw paths, for messages
	idRaw, updatedAtRaw, deletedRaw, deletedAtRaw, valueRaw string
}

func split(p string) []string {
	if p == "" || p == "." { // the object itself
		return nil
	}
	return strings.Split(p, ".")
}

func compilePaths(c Config) paths {
	return paths{
		items: split(c.ItemsPath), id: split(c.IDPath), updatedAt: split(c.UpdatedAtPath),
		deleted: split(c.DeletedPath), deletedAt: split(c.DeletedAtPath), value: split(c.ValuePath),
		next: split(c.NextCursorPath), hasMore: split(c.HasMorePath), errCode: split(c.ErrorCodePath),
		idRaw: c.IDPath, updatedAtRaw: c.UpdatedAtPath, deletedRaw: c.DeletedPath, deletedAtRaw: c.DeletedAtPath, valueRaw: c.ValuePath,
	}
}

// lookup follows keys from raw. found is false when a key is missing; an
// error means a step is not an object.
func lookup(raw json.RawMessage, keys []string) (v json.RawMessage, found bool, err error) {
	v = raw
	for i, k := range keys {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
			return nil, false, fmt.Errorf("%q is not an object", strings.Join(keys[:i], "."))
		}
		if v, found = obj[k]; !found {
			return nil, false, nil
		}
	}
	return v, true, nil
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// intRE is a JSON integer: ids written as numbers must be integers, so the
// key text is unambiguous.
var intRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// parse decodes one page body.
func (s *Source) parse(body []byte, hdr http.Header, reqURL *url.URL) (connector.Page, error) {
	if !json.Valid(body) {
		return connector.Page{}, errors.New("the body is not JSON")
	}
	rawItems, found, err := lookup(body, s.paths.items)
	if err != nil || !found {
		return connector.Page{}, fmt.Errorf("no items array at %q", s.cfg.ItemsPath)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(rawItems, &items); err != nil || items == nil && !isNull(rawItems) {
		return connector.Page{}, fmt.Errorf("%q is not an array", s.cfg.ItemsPath)
	}
	if isNull(rawItems) {
		return connector.Page{}, fmt.Errorf("%q is null, not an array", s.cfg.ItemsPath)
	}
	page := connector.Page{Rows: make([]connector.Row, 0, len(items))}
	at := make(map[string]int, len(items)) // id -> its first item
	for i, it := range items {
		row, err := s.item(it)
		if err != nil {
			return connector.Page{}, fmt.Errorf("item %d: %w", i, err)
		}
		// One page is one read of the feed: an id in it twice, in two
		// versions, means a change log (every version of a row), not the
		// current state of each row. Each pass would re-read the older
		// version after the newer one was published, and publish both
		// again, for ever.
		if j, ok := at[row.ID]; ok {
			if prev := page.Rows[j]; !prev.UpdatedAt.Equal(row.UpdatedAt) || prev.Deleted != row.Deleted || !bytes.Equal(prev.Value, row.Value) {
				return connector.Page{}, fmt.Errorf("items %d and %d hold two versions of id %q (%s %s and %s): the API returns a change log, every version of a row; "+
					"tidemark reads the current state of each changed row (docs/http-source.md, \"What the source needs from an API\") and would publish the older version again after the newer one on every pass",
					j, i, row.ID, s.cfg.UpdatedAtPath, schemas.FormatTime(prev.UpdatedAt), schemas.FormatTime(row.UpdatedAt))
			}
		} else {
			at[row.ID] = i
		}
		page.Rows = append(page.Rows, row)
	}
	if s.cfg.Pagination == PaginateLink {
		next, err := s.nextLink(hdr, reqURL)
		if err != nil {
			return connector.Page{}, err
		}
		page.Next, page.End = next, next == ""
		return page, nil
	}
	return s.endSignal(body, page)
}

// endSignal reads next_cursor and has_more. Only an explicit signal ends the
// pass: next_cursor null, or has_more false when configured.
func (s *Source) endSignal(body []byte, page connector.Page) (connector.Page, error) {
	hasMore, moreKnown := true, false
	if s.paths.hasMore != nil {
		v, found, err := lookup(body, s.paths.hasMore)
		if err != nil {
			return page, err
		}
		if found && !isNull(v) {
			if err := json.Unmarshal(v, &hasMore); err != nil {
				return page, fmt.Errorf("%q is not a boolean", s.cfg.HasMorePath)
			}
			moreKnown = true
		}
	}
	if moreKnown && !hasMore {
		page.End = true
		return page, nil
	}
	v, found, err := lookup(body, s.paths.next)
	if err != nil {
		return page, err
	}
	switch {
	case !found:
		return page, fmt.Errorf("no %q in the body, and no has_more: false; the end of a walk must be explicit", s.cfg.NextCursorPath)
	case isNull(v):
		if moreKnown && hasMore {
			return page, fmt.Errorf("%q is null but %q is true; the server contradicts itself", s.cfg.NextCursorPath, s.cfg.HasMorePath)
		}
		page.End = true
		return page, nil
	}
	var next string
	if err := json.Unmarshal(v, &next); err != nil {
		var n json.Number
		if json.Unmarshal(v, &n) != nil {
			return page, fmt.Errorf("%q is neither a string, a number nor null", s.cfg.NextCursorPath)
		}
		next = n.String()
	}
	if next == "" {
		return page, fmt.Errorf("%q is an empty string; only null ends a walk", s.cfg.NextCursorPath)
	}
	page.Next = next
	return page, nil
}

// item decodes one item into a Row.
func (s *Source) item(raw json.RawMessage) (connector.Row, error) {
	var row connector.Row
	p := &s.paths
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return row, errors.New("not a JSON object")
	}
	// id
	v, found, err := lookup(raw, p.id)
	switch {
	case err != nil:
		return row, fmt.Errorf("field %q: %w", p.idRaw, err)
	case !found || isNull(v):
		return row, fmt.Errorf("field %q: missing", p.idRaw)
	}
	var id string
	if json.Unmarshal(v, &id) == nil {
		if id == "" {
			return row, fmt.Errorf("field %q: empty", p.idRaw)
		}
	} else if t := string(bytes.TrimSpace(v)); intRE.MatchString(t) {
		id = t
	} else {
		return row, fmt.Errorf("field %q: %s is neither a string nor an integer", p.idRaw, clip(v))
	}
	row.ID = id
	// updated_at
	v, found, err = lookup(raw, p.updatedAt)
	if err == nil && (!found || isNull(v)) {
		err = errors.New("missing")
	}
	if err == nil {
		var ts string
		if json.Unmarshal(v, &ts) != nil {
			err = fmt.Errorf("%s is not a string", clip(v))
		} else {
			row.UpdatedAt, err = schemas.ParseTime(ts)
		}
	}
	if err != nil {
		return row, fmt.Errorf("id %q: field %q: %w", id, p.updatedAtRaw, err)
	}
	// deleted
	if p.deleted != nil {
		v, found, err := lookup(raw, p.deleted)
		if err != nil {
			return row, fmt.Errorf("id %q: field %q: %w", id, p.deletedRaw, err)
		}
		if found && !isNull(v) {
			var d bool
			if json.Unmarshal(v, &d) != nil {
				return row, fmt.Errorf("id %q: field %q: %s is not a boolean", id, p.deletedRaw, clip(v))
			}
			row.Deleted = d
		}
	}
	if p.deletedAt != nil {
		v, found, err := lookup(raw, p.deletedAt)
		if err != nil {
			return row, fmt.Errorf("id %q: field %q: %w", id, p.deletedAtRaw, err)
		}
		if found && !isNull(v) {
			var ts string
			if json.Unmarshal(v, &ts) != nil {
				return row, fmt.Errorf("id %q: field %q: %s is not a timestamp or null", id, p.deletedAtRaw, clip(v))
			}
			if _, err := schemas.ParseTime(ts); err != nil {
				return row, fmt.Errorf("id %q: field %q: %w", id, p.deletedAtRaw, err)
			}
			row.Deleted = true
		}
	}
	if row.Deleted {
		return row, nil
	}
	// value: the item (or the part at ValuePath), byte for byte as the
	// server sent it (surrounding whitespace trimmed). Nothing is
	// re-encoded, so key order, number text and spacing are the server's,
	// and a table read through the reference feed yields the same record
	// values as the PostgreSQL source.
	v, found, err = lookup(raw, p.value)
	if err == nil && !found {
		err = errors.New("missing")
	}
	v = bytes.TrimSpace(v)
	if err == nil && (len(v) == 0 || v[0] != '{') {
		err = fmt.Errorf("%s is not a JSON object", clip(v))
	}
	if err != nil {
		name := p.valueRaw
		if name == "" {
			name = "(the item)"
		}
		return row, fmt.Errorf("id %q: field %q: %w", id, name, err)
	}
	row.Value = bytes.Clone(v)
	return row, nil
}

func clip(v json.RawMessage) string {
	s := string(bytes.TrimSpace(v))
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return s
}

// errorCode and errorMessage read an error body, if it is JSON.
func errorCode(body []byte, path []string) string {
	if path == nil || !json.Valid(body) {
		return ""
	}
	v, found, err := lookup(body, path)
	if err != nil || !found {
		return ""
	}
	var code string
	if json.Unmarshal(v, &code) != nil {
		return ""
	}
	return code
}

func errorMessage(body []byte, codePath []string) string {
	if len(codePath) == 0 || !json.Valid(body) {
		return ""
	}
	path := append(append([]string(nil), codePath[:len(codePath)-1]...), "message")
	v, found, err := lookup(body, path)
	if err != nil || !found {
		return ""
	}
	var msg string
	_ = json.Unmarshal(v, &msg)
	return msg
}

// nextLink returns the target of the Link header's rel="next", resolved
// against the request URL, or "" when there is none (the end of the walk).
func (s *Source) nextLink(hdr http.Header, reqURL *url.URL) (string, error) {
	for _, l := range parseLinks(hdr.Values("Link")) {
		if !l.rel("next") {
			continue
		}
		u, err := reqURL.Parse(l.target)
		if err != nil {
			return "", fmt.Errorf("the next link %q is not a URL", l.target)
		}
		if !s.sameOrigin(u) {
			return "", fmt.Errorf("the next link points to another origin (%s://%s); refusing to send credentials there", u.Scheme, u.Host)
		}
		if target, err := url.Parse(l.target); err == nil && target.User == nil {
			// Resolving a link copies the request's user info (the
			// endpoint's basic-auth password) into it; the link is stored
			// in the checkpoint and the ledger, so it is kept as the server
			// sent it, and pageURL adds the endpoint's user info back.
			u.User = nil
		}
		return u.String(), nil
	}
	return "", nil
}

type link struct {
	target string
	rels   []string
}

func (l link) rel(r string) bool {
	for _, x := range l.rels {
		if strings.EqualFold(x, r) {
			return true
		}
	}
	return false
}

// parseLinks parses RFC 8288 Link header values:
// <target>; rel="next"; title="x", <other>; rel=prev
func parseLinks(values []string) []link {
	var out []link
	for _, v := range values {
		for {
			i := strings.IndexByte(v, '<')
			if i < 0 {
				break
			}
			j := strings.IndexByte(v[i:], '>')
			if j < 0 {
				break
			}
			l := link{target: strings.TrimSpace(v[i+1 : i+j])}
			v = v[i+j+1:]
			// parameters up to the next comma outside quotes
			for {
				v = strings.TrimLeft(v, " \t")
				if !strings.HasPrefix(v, ";") {
					break
				}
				v = strings.TrimLeft(v[1:], " \t")
				k := 0
				for k < len(v) && v[k] != '=' && v[k] != ';' && v[k] != ',' {
					k++
				}
				name := strings.ToLower(strings.TrimSpace(v[:k]))
				v = v[k:]
				val := ""
				if strings.HasPrefix(v, "=") {
					v = strings.TrimLeft(v[1:], " \t")
					if strings.HasPrefix(v, `"`) {
						var b strings.Builder
						k := 1
						for ; k < len(v) && v[k] != '"'; k++ {
							if v[k] == '\\' && k+1 < len(v) {
								k++
							}
							b.WriteByte(v[k])
						}
						val = b.String()
						v = v[min(k+1, len(v)):]
					} else {
						k := 0
						for k < len(v) && v[k] != ';' && v[k] != ',' {
							k++
						}
						val = strings.TrimSpace(v[:k])
						v = v[k:]
					}
				}
				if name == "rel" {
					l.rels = append(l.rels, strings.Fields(val)...)
				}
			}
			out = append(out, l)
			v = strings.TrimLeft(v, " \t")
			if !strings.HasPrefix(v, ",") {
				break
			}
			v = v[1:]
		}
	}
	return out
}
