package schemas

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestAppendTimeMatchesLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1970, 1, 1, 0, 0, 0, 1000, time.UTC),
		time.Date(2262, 4, 11, 23, 47, 16, 854775000, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(2026, 11, 30, 4, 5, 6, 7000, time.FixedZone("x", 3600)),
	}
	for range 10000 {
		cases = append(cases, time.Unix(r.Int64N(253402300799), r.Int64N(1e9)))
	}
	for _, c := range cases {
		want := c.UTC().Truncate(time.Microsecond).Format(TimeLayout)
		if got := FormatTime(c); got != want {
			t.Fatalf("FormatTime(%v) = %s, want %s", c, got, want)
		}
		if back, err := ParseTime(want); err != nil || !back.Equal(c.Truncate(time.Microsecond)) {
			t.Fatalf("ParseTime(%s) = %v, %v", want, back, err)
		}
	}
	if got := FormatTime(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)); got != "10000-01-01T00:00:00.000000Z" {
		t.Errorf("year 10000: %s", got)
	}
}
