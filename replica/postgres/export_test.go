package postgres

import "context"

// SetBeforeCommit installs a hook that runs inside every Apply transaction,
// after the COPY, the merge and the positions, before COMMIT.
func (t *Target) SetBeforeCommit(fn func(context.Context) error) { t.beforeCommit = fn }
