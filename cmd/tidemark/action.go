package main

import (
	"errors"

	"github.com/tidemark/tidemark/connector"
)

// errorAction is what the operator should do about err, for the log line
// that ends a command: a safety stop's own hint, else the exit code's.
func errorAction(err error, code int) string {
	var stop *connector.StopError
	if errors.As(err, &stop) && stop.Hint != "" {
		return stop.Hint
	}
	var ce *ConfigError
	if errors.As(err, &ce) {
		return "fix the configuration or the grants named in the error and run again; nothing was committed past the last checkpoint"
	}
	return hintFor(err, code) // main.go
}
