package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/tidemark/tidemark/connector/httpsrc"
)

// helpCommand is `tidemark help [command]`.
func helpCommand(stdout, stderr io.Writer, args []string) int {
	if len(args) == 0 {
		usage(stdout)
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] && c.run == nil { // version and help take no configuration and no flags
			use := "tidemark " + c.name
			if c.name == "help" {
				use += " [command]"
			}
			fmt.Fprintf(stdout, "tidemark %s: %s\n\nUsage:\n  %s\n", c.name, c.summary, use)
			return exitOK
		}
		if c.name == args[0] {
			a := &cli{stdout: stdout, stderr: stderr, env: func(string) string { return "" }}
			sub := []string{"--help"}
			if c.name == "feed" {
				sub = []string{"serve", "--help"}
			}
			_ = a.parse(c.name, sub)
			return exitOK
		}
	}
	fmt.Fprintf(stderr, "tidemark help: unknown command %q%s; run `tidemark help` for the commands\n", args[0], didYouMean(args[0], commandNames()))
	return exitConfig
}

func commandNames() []string {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	return names
}

// commandHelp prints a command's summary and its own flags; the flags that
// set configuration keys are summarized, not listed.
func commandHelp(w io.Writer, name string, fs *flag.FlagSet) {
	summary := ""
	for _, c := range commands {
		if c.name == name {
			summary = c.summary
		}
	}
	use := "tidemark " + name + " --config FILE [flags]"
	if name == "feed" {
		use = "tidemark feed serve --config FILE [flags]"
	}
	fmt.Fprintf(w, "tidemark %s: %s\n\nUsage:\n  %s\n\nFlags:\n", name, summary, use)
	keys := map[string]bool{}
	for _, k := range ConfigKeys() {
		keys[k] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		if keys[f.Name] {
			return
		}
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		if d := f.DefValue; d != "" && d != "false" && d != "0" && d != "0s" {
			usage += " (default " + d + ")"
		}
		fmt.Fprintf(w, "%-28s %s\n", line, usage)
	})
	fmt.Fprintf(w, "\nEvery configuration key is a flag too (--source.table orders) and an environment variable\n(%s); `tidemark help` lists the keys, tidemark.example.yaml explains them.\n", EnvName("source.table"))
	fmt.Fprintf(w, "Exit codes: 0 done, 1 runtime failure, 2 bad configuration or usage, 3 safety stop, 4 fenced, 5 verify found differences.\n")
}

// flagError is the one-line answer to a command line the flag set refused,
// with a suggestion and where to look, instead of the usage of every flag.
func flagError(name string, fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if bad, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		bad = strings.TrimLeft(bad, "-")
		msg = fmt.Sprintf("unknown flag --%s%s", bad, didYouMean(bad, names))
	}
	help := "tidemark " + name + " --help"
	if name == "feed" {
		help = "tidemark feed serve --help"
	}
	return usageErrorf("%s; run `%s` for its flags", msg, help)
}

// didYouMean is ` (did you mean "x"?)` for the closest candidate, or "".
func didYouMean(s string, candidates []string) string {
	best, bestScore := "", math.MaxInt
	for _, c := range candidates {
		if d := levenshtein(s, c); d < bestScore {
			best, bestScore = c, d
		}
	}
	if best == "" || bestScore > max(2, len(s)/3) {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// knownEnv are TIDEMARK_* variables that are not configuration keys: the
// feed's secrets, profiling and failpoints, and the test suites' own.
var knownEnv = []string{envFeedKey, envFeedToken, "TIDEMARK_CPUPROFILE", "TIDEMARK_FAILPOINTS", "TIDEMARK_SOAK",
	"TIDEMARK_SEED", "TIDEMARK_CHAOS_SEED", "TIDEMARK_CLI_HELPER", "TIDEMARK_SWEEP_ITERATIONS"}

// unknownEnv describes the TIDEMARK_* variables that set nothing, each
// with the closest variable that does: a misspelt key would otherwise be
// ignored in silence.
func (a *cli) unknownEnv() []*ConfigError {
	if a.environ == nil {
		return nil
	}
	var names []string
	for _, k := range ConfigKeys() {
		names = append(names, EnvName(k))
	}
	// Variables the configuration names as a secret's (password_env,
	// auth_value_env) are read, not ignored.
	var secrets []string
	if a.cfg != nil {
		for _, c := range append([]*Config{a.cfg}, taskConfigs(a.cfg)...) {
			secrets = append(secrets, c.Source.PasswordEnv, c.Source.HTTP.AuthValueEnv, c.Kafka.SASL.PasswordEnv)
		}
	}
	var out []*ConfigError
	for _, kv := range a.environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "TIDEMARK_") || slices.Contains(names, name) || slices.Contains(knownEnv, name) || slices.Contains(secrets, name) ||
			strings.HasPrefix(name, "TIDEMARK_TEST_") || strings.HasPrefix(name, "TIDEMARK_MEM_") {
			continue
		}
		out = append(out, &ConfigError{Origin: "env " + name, Msg: "sets no configuration key and is ignored" + didYouMean(name, names)})
	}
	slices.SortFunc(out, func(x, y *ConfigError) int { return strings.Compare(x.Origin, y.Origin) })
	return out
}

// warnUnknownEnv warns about the TIDEMARK_* variables that set nothing.
func (a *cli) warnUnknownEnv() {
	for _, e := range a.unknownEnv() {
		a.log.Warn(fmt.Sprintf("environment variable %s %s", strings.TrimPrefix(e.Origin, "env "), e.Msg))
	}
}

// withUnknownEnv adds the TIDEMARK_* variables that set nothing to a
// configuration that failed to load: a misspelt required key shows up as
// missing, and the variable meant to set it is named next to it.
func (a *cli) withUnknownEnv(err error) error {
	unknown := a.unknownEnv()
	if len(unknown) == 0 {
		return err
	}
	errs := unjoin(err)
	for _, e := range unknown {
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// printable escapes control characters (terminal escapes, carriage
// returns) in text bound for a terminal, keeping its line breaks.
func printable(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = httpsrc.Escape(l)
	}
	return strings.Join(lines, "\n")
}

// isHelp reports whether err is the flag set's -h/--help.
func isHelp(err error) bool { return errors.Is(err, flag.ErrHelp) }

// taskConfigs are the configurations of c's tasks.
func taskConfigs(c *Config) []*Config {
	var out []*Config
	for _, t := range c.Tasks {
		if t.Cfg != nil {
			out = append(out, t.Cfg)
		}
	}
	return out
}
