// Package metrics turns the walk engine's events into Prometheus metrics and
// serves them, with health and readiness endpoints, over HTTP.
//
// It owns the metric names (all prefixed tidemark_, every series labelled
// with the constant label connector=<name>) and the readiness decision. It
// must not touch Kafka or PostgreSQL itself: the caller registers checks
// (AddCheck) that probe them, and the engine reports through the
// connector.Observer interface that *Metrics implements.
//
//	m := metrics.New(metrics.Config{Connector: "orders", MaxLag: 5 * time.Minute})
//	m.AddCheck("kafka", func(ctx context.Context) error { return client.Ping(ctx) })
//	srv, err := m.Listen("127.0.0.1:9464") // /metrics, /healthz, /readyz
//	...
//	engine, _ := connector.New(connector.Config{Name: "orders", Observer: m}, src, pub, store)
//	engine.Run(ctx, connector.Continuous)
//	srv.Shutdown(context.Background())
//
// Sweep and verify code reports its results with SweepResult and
// VerifyResult.
package metrics
