package postgres

import (
	"errors"
	"fmt"
	"strings"
)

// checkFilter makes sure the operator filter is one self-contained
// expression before it is spliced into SQL as "AND (<filter>\n)". A string
// such as "x) OR (true" would parse but escape its parentheses and turn the
// keyset seek into a full scan on every page (an endless pass), so the
// filter is lexed the way PostgreSQL lexes it (string and identifier
// quoting, dollar quoting, comments) and refused when its parentheses do
// not balance, when it holds a statement separator, or when it uses a
// parameter placeholder ($1), which would alias the page query's own
// parameters. The newline before the closing parenthesis keeps a trailing
// "--" comment from swallowing the rest of the query.
func checkFilter(f string) error {
	if strings.TrimSpace(f) == "" {
		return nil
	}
	depth := 0
	for i := 0; i < len(f); {
		c := f[i]
		switch {
		case c == '\'':
			// A standard string; E'' strings also allow backslash escapes.
			escapes := i > 0 && (f[i-1] == 'e' || f[i-1] == 'E') && (i == 1 || !isIdentChar(f[i-2]))
			j := i + 1
			for ; j < len(f); j++ {
				if escapes && f[j] == '\\' {
					j++
					continue
				}
				if f[j] == '\'' {
					if j+1 < len(f) && f[j+1] == '\'' {
						j++
						continue
					}
					break
				}
			}
			if j >= len(f) {
				return errors.New("unterminated string literal")
			}
			i = j + 1
		case c == '"':
			j := i + 1
			for ; j < len(f); j++ {
				if f[j] == '"' {
					if j+1 < len(f) && f[j+1] == '"' {
						j++
						continue
					}
					break
				}
			}
			if j >= len(f) {
				return errors.New("unterminated quoted identifier")
			}
			i = j + 1
		case c == '$':
			// A '$' inside an identifier (a$1) is neither a placeholder nor
			// a quote.
			if i > 0 && isIdentChar(f[i-1]) {
				i++
				continue
			}
			if i+1 < len(f) && f[i+1] >= '0' && f[i+1] <= '9' {
				return fmt.Errorf("parameter placeholder %q is not allowed; write the value literally", f[i:i+2])
			}
			// Dollar quote $tag$...$tag$ (tag may be empty).
			j := i + 1
			for j < len(f) && f[j] != '$' && isIdentChar(f[j]) {
				j++
			}
			if j >= len(f) || f[j] != '$' {
				i++
				continue
			}
			tag := f[i : j+1]
			end := strings.Index(f[j+1:], tag)
			if end < 0 {
				return errors.New("unterminated dollar-quoted string")
			}
			i = j + 1 + end + len(tag)
		case c == '-' && i+1 < len(f) && f[i+1] == '-':
			j := strings.IndexByte(f[i:], '\n')
			if j < 0 {
				return balanced(depth)
			}
			i += j + 1
		case c == '/' && i+1 < len(f) && f[i+1] == '*':
			nest := 1
			j := i + 2
			for ; j < len(f) && nest > 0; j++ {
				if f[j] == '/' && j+1 < len(f) && f[j+1] == '*' {
					nest++
					j++
				} else if f[j] == '*' && j+1 < len(f) && f[j+1] == '/' {
					nest--
					j++
				}
			}
			if nest > 0 {
				return errors.New("unterminated comment")
			}
			i = j
		case c == '(':
			depth++
			i++
		case c == ')':
			depth--
			if depth < 0 {
				return errors.New("a ')' closes a parenthesis the filter did not open; the filter must be one self-contained expression")
			}
			i++
		case c == ';':
			return errors.New("';' is not allowed; the filter is one boolean expression")
		default:
			i++
		}
	}
	return balanced(depth)
}

func balanced(depth int) error {
	if depth != 0 {
		return errors.New("unbalanced parentheses")
	}
	return nil
}

func isIdentChar(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}
