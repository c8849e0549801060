package offsets

// SetAfterCheckpointRead runs fn between Load's checkpoint read and its
// ledger audit, for as long as the test runs.
func SetAfterCheckpointRead(fn func()) (restore func()) {
	prev := afterCheckpointRead
	afterCheckpointRead = fn
	return func() { afterCheckpointRead = prev }
}
