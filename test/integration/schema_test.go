package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/rig"
)

// schemaDDL is the table of the schema-change tests: a payload to change
// and a column to drop or retype.
const schemaDDL = `CREATE TABLE items (
	id bigint PRIMARY KEY,
	updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	deleted_at timestamptz,
	v text,
	n integer NOT NULL DEFAULT 0
);
CREATE INDEX items_updated_at_id ON items (updated_at, id)`

// schemaRun runs the engine continuously under a workload that updates
// random rows, applies ddl in the middle, lets both go on, then stops them
// and returns the engine's error (nil for a clean stop) and what it logged.
func schemaRun(t *testing.T, r *rig.Rig, cfg connector.Config, ddl string) (error, string) {
	t.Helper()
	r.Exec(`INSERT INTO items (id, v) SELECT g, 'v' || g FROM generate_series(1, 200) g`)
	var log syncBuf
	cfg.Logger = rig.LoggerTo(&log)
	cfg.PollInterval = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runErr error
	done := make(chan struct{})
	go func() { _, runErr = r.Engine(r.Src, cfg).Run(ctx, connector.Continuous); close(done) }()
	stopWork := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stopWork:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = r.DB.Pool.Exec(context.Background(), `UPDATE items SET v = md5(random()::text), updated_at = clock_timestamp() WHERE id = $1`, 1+rng.IntN(200))
		}
	}()
	time.Sleep(400 * time.Millisecond)
	r.Exec(ddl)
	time.Sleep(800 * time.Millisecond)
	close(stopWork)
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not stop")
	}
	return runErr, log.String()
}

// TestSchemaChangeAllColumns: with every column selected, an added column
// appears in the records from the next pass on, a dropped one disappears,
// and a retyped one is encoded by its new type; each change is logged. With
// on_schema_change republish the sweep then republishes every row whose
// record differs, and the topic equals the table, every record in the new
// shape; with continue, rows not written since keep their old records until
// a sweep (here run by hand) repairs them.
func TestSchemaChangeAllColumns(t *testing.T) {
	for _, tc := range []struct {
		name, ddl string
	}{
		{"add column", `ALTER TABLE items ADD COLUMN channel text NOT NULL DEFAULT 'web'`},
		{"drop column", `ALTER TABLE items DROP COLUMN n`},
		{"retype column", `ALTER TABLE items ALTER COLUMN n TYPE text USING n::text || '!'`},
	} {
		for _, republish := range []bool{true, false} {
			name := tc.name + " continue"
			if republish {
				name = tc.name + " republish"
			}
			t.Run(name, func(t *testing.T) {
				r := newRig(t, schemaDDL, "items")
				// A short margin: rows not written since the change are not
				// re-read (a retype rewrites every row, with a fresh xmin).
				cfg := connector.Config{PageSize: 50, TxnMaxRecords: 100, Margin: 50 * time.Millisecond, RepublishOnSchemaChange: republish}
				err, logged := schemaRun(t, r, cfg, tc.ddl)
				if err != nil {
					t.Fatalf("engine: %v", err)
				}
				if !strings.Contains(logged, "the source's columns changed") {
					t.Errorf("the change was not logged:\n%s", logged)
				}
				if !republish {
					if d := rig.Diff(r.Fold(), r.Expected()); len(d) == 0 {
						t.Error("with continue, every row already has the new shape: the test changed no record")
					}
					r.Sweep(connector.Config{})
				} else {
					r.Once(r.Src, cfg)
				}
				st := r.AssertTable()
				rig.AssertNoDupes(t, st)
			})
		}
	}
}

// TestSchemaChangeStops: a listed column dropped or retyped incompatibly,
// a renamed updated_at or id column, updated_at made nullable and an id no
// longer unique stop the run (a safety stop,
// exit 3) naming the column; nothing is published on the new shape.
func TestSchemaChangeStops(t *testing.T) {
	for _, tc := range []struct {
		name, ddl, want string
		columns         []string
	}{
		{"listed column dropped", `ALTER TABLE items DROP COLUMN n`, `"n"`, []string{"id", "updated_at", "v", "n"}},
		{"listed column retyped", `ALTER TABLE items ALTER COLUMN n TYPE text`, `"n"`, []string{"id", "updated_at", "v", "n"}},
		{"updated_at renamed", `ALTER TABLE items RENAME COLUMN updated_at TO changed_at`, "updated_at", nil},
		{"id renamed", `ALTER TABLE items RENAME COLUMN id TO item_id`, "id", nil},
		// Incremental pages never return a row whose updated_at is NULL
		// (it compares as unknown): it would be lost without a word.
		{"updated_at made nullable", `ALTER TABLE items ALTER COLUMN updated_at DROP NOT NULL`, "updated_at", nil},
		// Without a unique id, (updated_at, id) no longer orders rows
		// totally: a page boundary inside a tie would skip rows.
		{"id no longer unique", `ALTER TABLE items DROP CONSTRAINT items_pkey`, "id", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, schemaDDL, "items")
			pg := r.PG
			pg.Columns = tc.columns
			src := r.Open(pg)
			cfg := connector.Config{PageSize: 50, TxnMaxRecords: 100}
			r.Exec(`INSERT INTO items (id, v) SELECT g, 'v' || g FROM generate_series(1, 50) g`)
			r.Once(src, cfg)
			r.Exec(tc.ddl)
			r.Exec(`INSERT INTO items (v) SELECT 'after' WHERE false`) // nothing; the change alone
			_, err := r.Engine(src, cfg).Run(context.Background(), connector.Once)
			var stop *connector.StopError
			if !errors.As(err, &stop) {
				t.Fatalf("want a safety stop, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the stop does not name %s: %v", tc.want, err)
			}
		})
	}
}

// syncBuf is a strings.Builder safe for a logger and a reader.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
