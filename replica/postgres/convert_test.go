package postgres

import "testing"

func TestToText(t *testing.T) {
	cases := []struct {
		raw       string
		k, elem   kind
		want, err string
	}{
		{`"a \"b\""`, kindScalar, 0, `a "b"`, ""},
		{`12.50`, kindScalar, 0, `12.50`, ""},
		{`true`, kindScalar, 0, `true`, ""},
		{`{"b":1,  "a":2}`, kindJSON, 0, `{"b":1,  "a":2}`, ""},
		{`"AP9c"`, kindBytea, 0, `\x00ff5c`, ""},
		{`"@@"`, kindBytea, 0, "", "base64"},
		{`["a","b,c","q\"uote",null,"NULL"]`, kindArray, kindScalar, `{"a","b,c","q\"uote",NULL,"NULL"}`, ""},
		{`[[1,2],[3,null]]`, kindArray, kindScalar, `{{"1","2"},{"3",NULL}}`, ""},
		{`["AP8=",null]`, kindArray, kindBytea, `{"\\x00ff",NULL}`, ""},
		{`[{"a":[1]}]`, kindArray, kindJSON, `{"{\"a\":[1]}"}`, ""},
		{`[]`, kindArray, kindScalar, `{}`, ""},
		{`"x"`, kindArray, kindScalar, "", "expected a JSON array"},
	}
	for _, c := range cases {
		got, err := toText([]byte(c.raw), c.k, c.elem)
		if c.err != "" {
			if err == nil || !contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.raw, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.raw, got, err, c.want)
		}
	}
}

func TestInferType(t *testing.T) {
	cls := func(raws ...string) map[jsonClass]bool {
		m := map[jsonClass]bool{}
		for _, r := range raws {
			m[classify([]byte(r))] = true
		}
		return m
	}
	cases := map[string][]string{
		"bigint":                   {`1`, `null`, `-5`},
		"double precision":         {`1`, `1.5`, `"NaN"`},
		"boolean":                  {`true`, `false`},
		"timestamp with time zone": {`"2024-05-01T12:00:00.000001Z"`, `"infinity"`},
		"uuid":                     {`"c4ca4238-a0b9-3382-8dcc-509a6f75849b"`},
		"jsonb":                    {`{"a":1}`, `[1]`, `"x"`},
		"text":                     {`"12.50"`, `1`},
	}
	for want, raws := range cases {
		if got := inferType(cls(raws...)); got != want {
			t.Errorf("%v: %s, want %s", raws, got, want)
		}
	}
	// Integers a double would round (beyond 2^53) or a bigint cannot hold
	// (an HTTP source's) infer numeric, which holds them and fractions.
	for _, raws := range [][]string{
		{`12345678901234567890`, `1`},
		{`9007199254740993`, `1.5`},
		{`-99999999999999999999999`, `2.25`},
	} {
		if got := inferType(cls(raws...)); got != "numeric" {
			t.Errorf("%v: %s, want numeric", raws, got)
		}
	}
	if got := inferType(cls(`9007199254740993`, `1`)); got != "bigint" {
		t.Errorf("wide integers that fit a bigint: %s, want bigint", got)
	}
	if got := inferType(cls(`null`)); got != "text" {
		t.Errorf("only nulls: %s", got)
	}
}

func TestCompatible(t *testing.T) {
	for _, c := range []struct {
		src, dst string
		ok       bool
	}{
		{"integer", "bigint", true}, {"bigint", "integer", false}, {"numeric(20,6)", "numeric", true},
		{"text[]", "text[]", true}, {"integer[]", "bigint[]", true}, {"integer[]", "integer", false},
		{"uuid", "text", true}, {"text", "integer", false}, {"jsonb", "json", true}, {"bytea", "text", true},
		// A target modifier narrower than the source's: PostgreSQL's casts
		// truncate strings and round numbers without an error.
		{"text", "character varying(10)", false}, {"character varying", "character varying(10)", false},
		{"character varying(100)", "character varying(5)", false}, {"character varying(5)", "character varying(10)", true},
		{"character varying(5)", "text", true}, {"character(3)", "character(3)", true}, {"character(4)", "character(3)", false},
		{"character varying(10)[]", "character varying(5)[]", false}, {"character varying(5)[]", "character varying(5)[]", true},
		{"bit(3)", "bit(3)", true}, {"bit(4)", "bit(3)", false},
		{"numeric", "numeric(10,2)", false}, {"numeric(8,2)", "numeric(10,2)", true}, {"numeric(10,4)", "numeric(10,2)", false},
		{"numeric(10,2)", "numeric(9,2)", false}, {"numeric(5)", "numeric(7,2)", true},
		{"integer", "numeric(10,0)", true}, {"bigint", "numeric(10,0)", false}, {"bigint", "numeric(21,2)", true}, {"smallint", "numeric(4)", false},
		{"timestamp with time zone", "timestamp(3) with time zone", false}, {"timestamp(3) with time zone", "timestamp with time zone", true},
		{"timestamp(2) without time zone", "timestamp(3) with time zone", true}, {"interval", "interval(3)", false},
	} {
		if got := compatible(c.src, c.dst); got != c.ok {
			t.Errorf("compatible(%s, %s) = %v", c.src, c.dst, got)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
