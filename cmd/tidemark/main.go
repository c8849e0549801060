// Command tidemark streams a changing table (or a changes API) into a
// compacted Kafka topic exactly once. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/producer"
)

// Exit codes (README.md, Exit codes).
const (
	exitOK       = 0
	exitFailure  = 1 // runtime failure after retries
	exitConfig   = 2 // bad configuration or usage
	exitDecision = 3 // safety stop: needs an operator decision
	exitFenced   = 4 // fenced by another instance
	exitMismatch = 5 // verify: the target differs from the source
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// TIDEMARK_CPUPROFILE=FILE writes a CPU profile of the whole run (for
	// `make bench` and performance work).
	if path := os.Getenv("TIDEMARK_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				defer f.Close()
				defer pprof.StopCPUProfile()
			}
		}
	}
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	pprof.StopCPUProfile()
	os.Exit(code)
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, a *cli) error
}

var commands = []command{
	{"run", "sync the source into Kafka (continuously, or --once)", cmdRun},
	{"check", "preflight: check the source table and the topics (creating missing ones), print what was found", checkCommand},
	{"status", "print the committed checkpoint", perTask(cmdStatus)},
	{"verify", "prove the topic (or a replica table) equals the source: key set and content", replicaOfOneTask(perTask(cmdVerify))},
	{"sweep", "reconcile now: tombstones for hard-deleted rows, repair of missing or stale keys", perTask(cmdSweep)},
	{"replica", "fold the topic into a PostgreSQL table, exactly once (--target-table, --from-beginning, --once)", oneTask(cmdReplica)},
	{"ledger", "print the ledger: runs, where each resumed from, and every committed transaction", perTask(cmdLedger)},
	{"reset", "operator decision: start the connector over from scratch or from a stated watermark", oneTask(cmdReset)},
	{"feed", "serve the configured table as a reference changes API: feed serve --listen 127.0.0.1:8080 --hmac-key-file F", cmdFeed},
	{"broker", "serve the embedded broker's data on its own (embedded.listen), for kcat and other Kafka clients", cmdBroker},
	{"version", "print the version (also --version; needs no configuration)", nil},
	{"help", "help for a command: tidemark help run (also tidemark run --help)", nil},
}

// run is the whole CLI; main only wires the process to it, so tests run it
// in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, stdout, stderr, os.Getenv, os.Environ)
}

// runEnv is run with the environment given: env looks a variable up,
// environ lists them all (for the TIDEMARK_* check, help.go).
func runEnv(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string, environ func() []string) int {
	if len(args) == 0 {
		usage(stderr)
		return exitConfig
	}
	switch args[0] {
	case "-h", "--help", "-help":
		usage(stdout)
		return exitOK
	case "help":
		return helpCommand(stdout, stderr, args[1:]) // help.go
	case "version", "--version", "-version", "-v":
		fmt.Fprintln(stdout, "tidemark", version) // no configuration needed
		return exitOK
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "tidemark: unknown command %q%s; run `tidemark help` for the commands\n", args[0], didYouMean(args[0], commandNames()))
		return exitConfig
	}
	a := &cli{stdout: stdout, stderr: stderr, env: env, environ: environ}
	if err := a.parse(cmd.name, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		// A mistyped override may quote a DSN with its password.
		fmt.Fprintf(stderr, "tidemark %s: %s\n", cmd.name, printable(redactText(err.Error())))
		return exitConfig
	}
	err := cmd.run(ctx, a)
	var sas *stoppedAtStartup
	if cmd.name == "run" && errors.As(err, &sas) {
		// A signal while waiting for the servers: a clean shutdown.
		if a.log != nil {
			a.log.Info(err.Error())
		}
		fmt.Fprintf(stderr, "tidemark %s: %s\n", cmd.name, err.Error())
		return exitOK
	}
	// Kafka refusing the login or an operation is a configuration error
	// (exit 2) for every command, not only those that connect first.
	err = a.explainKafkaAccess(err) // security.go
	code := exitCode(err)
	if err != nil {
		if a.log != nil {
			a.log.Error(cmd.name+" stopped", "exit_code", code, "err", err.Error(), "action", errorAction(err, code))
		}
		fmt.Fprintf(stderr, "tidemark %s: %s\n", cmd.name, printable(redactText(err.Error())))
		if hint := hintFor(err, code); hint != "" {
			fmt.Fprintf(stderr, "(exit %d: %s)\n", code, hint)
		}
	}
	return code
}

func exitCode(err error) int {
	var cfgErr *ConfigError
	var stop *connector.StopError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, connector.ErrFenced):
		return exitFenced
	case errors.Is(err, errMismatch):
		return exitMismatch
	case errors.As(err, &stop):
		return exitDecision
	case errors.As(err, &cfgErr), errors.Is(err, postgres.ErrBadConfig), errors.Is(err, errUsage), errors.Is(err, connector.ErrInitialLoadOpen),
		errors.Is(err, producer.ErrTopicConfig), errors.Is(err, producer.ErrSetting):
		return exitConfig
	}
	return exitFailure
}

// hintFor is the hint printed after err's message: the exit code's, except
// for a server that check did not wait for (commands.go).
func hintFor(err error, code int) string {
	var nw *notWaited
	var sas *stoppedAtStartup
	if code == exitFailure && (errors.As(err, &sas) || errors.Is(err, context.Canceled)) {
		// Only a signal cancels the commands' context.
		return "stopped by a signal before it finished; what it committed stays committed, run it again to finish"
	}
	if code == exitFailure && errors.As(err, &nw) {
		return "check does not wait or retry: it could not reach " + nw.what + "; run it again once that answers (run and the other commands wait for it at start-up)"
	}
	return exitHint(code)
}

func exitHint(code int) string {
	switch code {
	case exitConfig:
		return "bad configuration or usage; fix it and run again"
	case exitDecision:
		return "safety stop; nothing was guessed, an operator decision is needed"
	case exitFenced:
		return "another instance with the same connector name took over; this one stopped writing"
	case exitMismatch:
		return "verify: the target differs from the source"
	case exitFailure:
		return "runtime failure after retries; the committed checkpoint is intact, run again to resume"
	}
	return ""
}

// errUsage marks a usage error (exit 2). Make one with usageErrorf: its
// message is the text alone, without the marker's.
var errUsage = errors.New("usage")

// usageError is a usage error whose message says what is wrong and the fix.
type usageError struct{ msg string }

func (e *usageError) Error() string        { return e.msg }
func (e *usageError) Is(target error) bool { return target == errUsage }

// usageErrorf formats a usage error (exit 2).
func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "tidemark %s — exactly-once delta sync from PostgreSQL to a compacted Kafka topic\n\nUsage:\n  tidemark <command> --config FILE [flags]\n\nCommands:\n", version)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	keys := ConfigKeys()
	sort.Strings(keys)
	fmt.Fprintf(w, "\nEvery configuration key can be set by flag (--%s orders, or --set %s=orders)\nand by environment variable (%s=orders). Precedence: flag > env > file.\n",
		"source.table", "source.table", EnvName("source.table"))
	fmt.Fprintf(w, "Keys: %s\n", strings.Join(keys, ", "))
	fmt.Fprintf(w, "\nExit codes: 0 done, 1 runtime failure, 2 bad configuration, 3 safety stop (operator decision), 4 fenced,\n5 verify found differences.\n")
}
