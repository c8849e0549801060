package producer

// ClassifyRecover exposes classifyRecover to the tests.
var ClassifyRecover = classifyRecover

// NewLZ4Compressor exposes the writer's LZ4 compressor to the benchmarks.
var NewLZ4Compressor = newLZ4Compressor
