package main

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"
)

// A configuration with a `tables:` list runs in task mode (docs/scale-out.md):
// each table is a task with its own transactional id, checkpoint, ledger
// entries and topic, and the processes of one configuration share the tasks
// through a Kafka consumer group (group.go).

// GroupConfig configures the consumer group of task mode (group.*).
type GroupConfig struct {
	// SessionTimeout is the group's session.timeout.ms: a member that
	// stops heartbeating (killed, partitioned) loses its tasks after this
	// long, and they start on the other members. The broker bounds it
	// (group.min.session.timeout.ms, 6s by default). Default 45s.
	SessionTimeout Duration `yaml:"session_timeout"`
	// RebalanceTimeout is the group's rebalance.timeout.ms: how long a
	// member may take to stop the tasks it gives up (aborting their open
	// transactions) when the group rebalances. Default 60s.
	RebalanceTimeout Duration `yaml:"rebalance_timeout"`
	// TasksTopic is the compacted topic with one partition per task whose
	// partitions the group assigns. Default "tidemark-tasks.<name>".
	TasksTopic string `yaml:"tasks_topic"`
}

// Bounds of group.session_timeout and group.rebalance_timeout. The Kafka
// client refuses either below 100ms, or above what the protocol's
// int32-millisecond field holds, when it is created; below 1s neither
// makes sense (brokers refuse a session timeout below
// group.min.session.timeout.ms, 6s by default). An explicit 0s is not the
// default: the client would refuse it at every start (exit 1, a crash
// loop), so it is refused here (exit 2). TestGroupTimeoutsWithinClientLimits
// checks the bounds against the client.
const (
	minGroupTimeout = time.Second
	maxGroupTimeout = time.Duration(math.MaxInt32) * time.Millisecond
)

func (c *Config) validateGroup(p *problems) {
	g := c.Group
	if d := g.SessionTimeout.Duration; d < minGroupTimeout || d > maxGroupTimeout {
		p.add("group.session_timeout", "%s is out of range; use %s..%s, e.g. 45s (the default): the Kafka client refuses less than 100ms, and brokers less than group.min.session.timeout.ms (6s by default)",
			g.SessionTimeout, minGroupTimeout, maxGroupTimeout)
	}
	if d := g.RebalanceTimeout.Duration; d < minGroupTimeout || d > maxGroupTimeout {
		p.add("group.rebalance_timeout", "%s is out of range; use %s..%s, e.g. 60s (the default), enough for a task to abort its transaction: the Kafka client refuses less than 100ms",
			g.RebalanceTimeout, minGroupTimeout, maxGroupTimeout)
	}
	if g.TasksTopic != "" {
		p.topic("group.tasks_topic", g.TasksTopic)
	}
}

// groupTimeouts are the client options of the group's timeouts: the
// session and rebalance timeouts, and a heartbeat a third of the session
// timeout, at most 3s.
func groupTimeouts(g GroupConfig) []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(g.SessionTimeout.Duration),
		kgo.RebalanceTimeout(g.RebalanceTimeout.Duration),
		kgo.HeartbeatInterval(min(3*time.Second, g.SessionTimeout.Duration/3)),
	}
}

// Task is one table of a `tables:` list.
type Task struct {
	// Name is the task's name: name: in its entry, else <schema>.<table>.
	Name string
	// Cfg is the task's whole configuration: the shared keys, then the
	// entry's. Its Name is <name>-<task>, which derives the transactional
	// id, the checkpoint key and the ledger entries.
	Cfg *Config
}

// tasksTopic is group.tasks_topic or its default.
func (c *Config) tasksTopic() string {
	if c.Group.TasksTopic != "" {
		return c.Group.TasksTopic
	}
	return "tidemark-tasks." + c.Name
}

// task returns the task named name.
func (c *Config) task(name string) (Task, bool) {
	for _, t := range c.Tasks {
		if t.Name == name {
			return t, true
		}
	}
	return Task{}, false
}

// taskNames lists the task names, for errors.
func (c *Config) taskNames() string {
	names := make([]string, len(c.Tasks))
	for i, t := range c.Tasks {
		names[i] = t.Name
	}
	return strings.Join(names, ", ")
}

// tableKeys are the keys of a table's entry besides source: and sync:.
const tableKeys = "name, table, schema, topic, source or sync"

// loadTasks builds the tasks of a configuration with tables: each from a
// copy of the shared configuration (file, environment and command line)
// with the entry's keys on top, then defaults and validation. A problem of
// a shared key is reported once; a problem of a key an entry set is named
// tables[i].key.
func (l *loader) loadTasks() (*Config, error) {
	base := l.c
	errs := slices.Clone(l.errs)
	at := func(n *yaml.Node) string { return l.at(n) }
	fail := func(n *yaml.Node, key, format string, args ...any) {
		errs = append(errs, &ConfigError{Origin: at(n), Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	seq := l.tables
	for seq.Kind == yaml.AliasNode && seq.Alias != nil {
		seq = seq.Alias
	}
	switch {
	case base.Source.Kind != "" && base.Source.Kind != "postgres":
		fail(l.tablesKey, "tables", "is for PostgreSQL sources; an HTTP source is one feed: remove tables: and set kafka.topic")
	case seq.Kind != yaml.SequenceNode:
		fail(seq, "tables", "expects a list of tables, e.g. [orders, sales.customers]")
	case len(seq.Content) == 0:
		fail(seq, "tables", "lists no table; list at least one, or remove tables: and set source.table")
	}
	if base.Name == "" {
		errs = append(errs, &ConfigError{Key: "name", Msg: "required; it names the connector and, with each task's name, the task's transactional id and checkpoint, e.g. name: shop"})
	} else if !nameRE.MatchString(base.Name) {
		errs = append(errs, &ConfigError{Key: "name", Origin: base.origin["name"], Msg: fmt.Sprintf("%q is not a valid name; use 1..200 of a-z A-Z 0-9 . _ -", base.Name)})
	}
	if base.Source.Table != "" {
		errs = append(errs, &ConfigError{Origin: base.origin["source.table"], Key: "source.table",
			Msg: "is set together with tables:; list that table under tables: instead"})
	}
	if base.Kafka.Topic != "" {
		errs = append(errs, &ConfigError{Origin: base.origin["kafka.topic"], Key: "kafka.topic",
			Msg: "names one topic; with tables: each table gets <kafka.topic_prefix><schema>.<table>, or set topic: in its entry"})
	}
	if len(errs) > 0 || seq.Kind != yaml.SequenceNode {
		return nil, errors.Join(dedupe(errs)...)
	}
	// A data topic is one task's: two tasks publishing to one topic
	// overwrite each other's keys, and each one's sweep tombstones the
	// other's rows as gone from its source.
	seen, topics := map[string]int{}, map[string]int{}
	for i, item := range seq.Content {
		t, taskErrs := l.task(i, item)
		errs = append(errs, taskErrs...)
		if t.Cfg == nil {
			continue
		}
		if j, dup := seen[t.Name]; dup {
			fail(item, fmt.Sprintf("tables[%d]", i), "task name %q is used twice (also by tables[%d]); give one of them a name:", t.Name, j)
			continue
		}
		if j, dup := topics[t.Cfg.Kafka.Topic]; dup {
			fail(item, fmt.Sprintf("tables[%d]", i), "topic %q is also the topic of tables[%d]; give one of them a topic: of its own "+
				"(two tasks in one topic overwrite each other's keys, and each one's sweep would tombstone the other's rows)", t.Cfg.Kafka.Topic, j)
			continue
		}
		seen[t.Name], topics[t.Cfg.Kafka.Topic] = i, i
		base.Tasks = append(base.Tasks, t)
	}
	base.ApplyDefaults()
	if base.Group.TasksTopic == "" && base.Name != "" {
		base.Group.TasksTopic = base.tasksTopic()
	}
	// The tasks topic is grown to a partition per task at start, which no
	// other topic of the connector may be: an offsets topic has one
	// partition, and a data topic's keys would move to other partitions.
	if tt := base.Group.TasksTopic; tt != "" {
		other := ""
		switch j, ok := topics[tt]; {
		case tt == base.Kafka.OffsetsTopic:
			other = "kafka.offsets_topic"
		case tt == base.Kafka.LedgerTopic:
			other = "kafka.ledger_topic"
		case ok:
			other = fmt.Sprintf("the topic of tables[%d]", j)
		}
		if other != "" {
			errs = append(errs, &ConfigError{Origin: base.origin["group.tasks_topic"], Key: "group.tasks_topic",
				Msg: fmt.Sprintf("%q is also %s; use a topic of its own (the group grows it to one partition per task), or leave it unset for %q",
					tt, other, "tidemark-tasks."+base.Name)})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(dedupe(errs)...)
	}
	slices.SortFunc(base.Tasks, func(a, b Task) int { return strings.Compare(a.Name, b.Name) })
	return base, nil
}

// task builds the task of entry i.
func (l *loader) task(i int, item *yaml.Node) (Task, []error) {
	for item.Kind == yaml.AliasNode && item.Alias != nil {
		item = item.Alias
	}
	prefix := fmt.Sprintf("tables[%d]", i)
	c := l.c.clone()
	sub := &loader{c: c, env: l.env, file: l.file}
	var name, topic string
	var nameNode *yaml.Node
	scalar := func(k, v *yaml.Node) (string, bool) {
		if v.Kind != yaml.ScalarNode {
			sub.fail(&ConfigError{Origin: l.at(v), Key: prefix + "." + k.Value, Msg: "expects a single value"})
			return "", false
		}
		s, err := expandVars(v.Value, l.env)
		if err != nil {
			sub.fail(&ConfigError{Origin: l.at(v), Key: prefix + "." + k.Value, Msg: err.Error()})
			return "", false
		}
		return s, true
	}
	switch item.Kind {
	case yaml.ScalarNode:
		// "table" or "schema.table"; a table name with a dot needs the
		// mapping form.
		v, err := expandVars(item.Value, l.env)
		if err != nil {
			return Task{}, []error{&ConfigError{Origin: l.at(item), Key: prefix, Msg: err.Error()}}
		}
		if schema, table, ok := strings.Cut(v, "."); ok {
			sub.set("source.schema", schema, l.at(item))
			sub.set("source.table", table, l.at(item))
		} else {
			sub.set("source.table", v, l.at(item))
		}
	case yaml.MappingNode:
		for j := 0; j+1 < len(item.Content); j += 2 {
			k, v := item.Content[j], item.Content[j+1]
			for v.Kind == yaml.AliasNode && v.Alias != nil {
				v = v.Alias
			}
			switch k.Value {
			case "name":
				name, _ = scalar(k, v)
				nameNode = v
			case "topic":
				topic, _ = scalar(k, v)
			case "table", "schema":
				if s, ok := scalar(k, v); ok {
					sub.set("source."+k.Value, s, l.at(v))
				}
			case "source", "sync":
				if v.Kind != yaml.MappingNode {
					sub.fail(&ConfigError{Origin: l.at(v), Key: prefix + "." + k.Value, Msg: "is a section; write its keys indented beneath it"})
					continue
				}
				sub.walk(v, k.Value)
			default:
				sub.fail(&ConfigError{Origin: l.at(k), Key: prefix, Msg: fmt.Sprintf("%s is not a key of a table; use %s", k.Value, tableKeys)})
			}
		}
	default:
		return Task{}, []error{&ConfigError{Origin: l.at(item), Key: prefix, Msg: "expects a table name or a mapping (table:, schema:, name:, topic:, source:, sync:)"}}
	}
	if len(sub.errs) > 0 {
		return Task{}, sub.errs
	}
	if c.Source.Table == "" {
		return Task{}, []error{&ConfigError{Origin: l.at(item), Key: prefix, Msg: "names no table; write table: <name>"}}
	}
	schema := cmp.Or(c.Source.Schema, defaults["source.schema"])
	if topic == "" {
		topic = c.Kafka.TopicPrefix + schema + "." + c.Source.Table
	}
	c.Kafka.Topic = topic
	c.origin["kafka.topic"] = l.at(item)
	if name == "" {
		name, nameNode = schema+"."+c.Source.Table, item
	}
	if !nameRE.MatchString(name) || len(l.c.Name)+1+len(name) > 200 {
		return Task{}, []error{&ConfigError{Origin: l.at(nameNode), Key: prefix,
			Msg: fmt.Sprintf("task name %q is not valid; give the entry a name: of a-z A-Z 0-9 . _ - (with the connector's name and a dash, at most 200 characters)", name)}}
	}
	c.Name = l.c.Name + "-" + name
	c.ApplyDefaults()
	var errs []error
	if err := c.Validate(); err != nil {
		for _, e := range unjoin(err) {
			var ce *ConfigError
			// A key the entry set is named after the entry; a shared one is
			// reported as it is, once (dedupe).
			if errors.As(e, &ce) && ce.Key != "" && ce.Key != "name" {
				if o, ok := c.origin[ce.Key]; ok && o != l.c.origin[ce.Key] {
					e = &ConfigError{Origin: ce.Origin, Key: prefix + "." + ce.Key, Msg: ce.Msg, Err: ce.Err}
				}
			}
			if errors.As(e, &ce) && ce.Key == "name" {
				continue // the shared name is checked with the base
			}
			errs = append(errs, e)
		}
	}
	return Task{Name: name, Cfg: c}, errs
}

// dedupe drops repeated errors (a shared key's problem, found in every
// task).
func dedupe(errs []error) []error {
	seen := map[string]bool{}
	var out []error
	for _, e := range errs {
		if s := e.Error(); !seen[s] {
			seen[s] = true
			out = append(out, e)
		}
	}
	return out
}
