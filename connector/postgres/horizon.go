package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark/tidemark/connector"
)

// horizonSQL samples the server clock and the start of the oldest
// transaction still open in this database in another client session. Any
// open transaction counts, not only those that already hold a transaction
// id: now() is a transaction's start time, so a transaction that has only
// read so far can still write an updated_at older than everything read
// since, and commit late. Background workers (autovacuum) do not write user
// tables and are ignored, as are transactions in other databases.
const horizonSQL = `SELECT clock_timestamp(), (
	SELECT min(xact_start) FROM pg_catalog.pg_stat_activity
	WHERE xact_start IS NOT NULL AND backend_type = 'client backend'
	  AND pid <> pg_backend_pid() AND datname = current_database())`

// Horizon reports the server's clock and the start time of the oldest
// transaction that is still running (holding a transaction id, or able to
// get one by writing), for horizon mode (docs/design.md, "The walk" and "Watermark"): W must not pass it,
// because that transaction may still commit rows whose updated_at is older
// than anything read so far. A long read-only transaction holds W back too:
// the price of never guessing which transactions will write.
//
// Privileges: pg_stat_activity shows other roles' xact_start and
// backend_xid only to superusers and members of pg_read_all_stats (or
// pg_monitor, which includes it). Without that, other roles' writers are
// invisible and the horizon silently ignores them; CheckHorizon reports it.
// Prepared (two-phase) transactions are not sessions and are not seen.
func (s *Source) Horizon(ctx context.Context) (connector.Horizon, error) {
	var now time.Time
	var oldest pgtype.Timestamptz
	if err := s.pool.QueryRow(ctx, horizonSQL).Scan(&now, &oldest); err != nil {
		return connector.Horizon{}, fmt.Errorf("sample horizon: %w", err)
	}
	h := connector.Horizon{Now: now.UTC()}
	if oldest.Valid && oldest.InfinityModifier == pgtype.Finite {
		h.OldestWriter = oldest.Time.UTC()
	}
	return h, nil
}

// CheckHorizon reports whether the role can see every session's
// transactions in pg_stat_activity, which horizon mode needs: Warn when it
// is not a superuser nor a member of pg_read_all_stats or pg_monitor.
// Callers add the finding to the preflight report when horizon mode is on.
func (s *Source) CheckHorizon(ctx context.Context) (Finding, error) {
	var role string
	var can bool
	// pg_has_role(..., 'USAGE') follows inherited membership (pg_monitor
	// includes pg_read_all_stats) and is true for superusers.
	err := s.pool.QueryRow(ctx, `SELECT current_user::text, pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')`).Scan(&role, &can)
	if err != nil {
		return Finding{}, fmt.Errorf("check horizon privileges: %w", err)
	}
	if !can {
		return Finding{Severity: Warn, Check: "horizon", Message: fmt.Sprintf(
			"role %s cannot see other roles' transactions in pg_stat_activity, so horizon mode would miss their open writes: GRANT pg_read_all_stats TO %s (or pg_monitor)",
			quote(role), quote(role))}, nil
	}
	return Finding{Severity: OK, Check: "horizon", Message: fmt.Sprintf("role %s sees every session's transactions (pg_read_all_stats)", quote(role))}, nil
}
