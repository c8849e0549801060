package main

import (
	"strings"
	"testing"
	"time"
)

const tablesConfig = `
name: shop
source:
  dsn: postgres://tidemark@db.example.com:5432/shop?sslmode=require
  deleted_at_column: deleted_at
sync:
  page_size: 500
kafka:
  brokers: [k1:9092]
  topic_prefix: "shop."
group:
  session_timeout: 10s
tables:
  - orders
  - sales.customers
  - table: line_items
    schema: sales
    name: items
    topic: items
    source:
      id_column: item_id
      deleted_at_column: ""
    sync:
      page_size: 5000
`

func TestTablesBecomeTasks(t *testing.T) {
	c := mustLoad(t, writeConfig(t, tablesConfig), nil)
	if len(c.Tasks) != 3 {
		t.Fatalf("tasks %d, want 3", len(c.Tasks))
	}
	// Sorted by task name: that order maps tasks to the partitions of the
	// tasks topic.
	want := []struct {
		task, name, schema, table, topic, id, deleted string
		page                                          int
	}{
		{"items", "shop-items", "sales", "line_items", "items", "item_id", "", 5000},
		{"public.orders", "shop-public.orders", "public", "orders", "shop.public.orders", "id", "deleted_at", 500},
		{"sales.customers", "shop-sales.customers", "sales", "customers", "shop.sales.customers", "id", "deleted_at", 500},
	}
	for i, w := range want {
		tk := c.Tasks[i]
		got := tk.Cfg
		if tk.Name != w.task || got.Name != w.name || got.Source.Schema != w.schema || got.Source.Table != w.table ||
			got.Kafka.Topic != w.topic || got.Source.IDColumn != w.id || got.Sync.PageSize != w.page || got.Source.DeletedAtColumn != w.deleted {
			t.Errorf("task %d: %s name=%s %s.%s topic=%s id=%s page=%d; want %+v", i, tk.Name, got.Name,
				got.Source.Schema, got.Source.Table, got.Kafka.Topic, got.Source.IDColumn, got.Sync.PageSize, w)
		}
		if got.Source.DSN != c.Source.DSN || got.Kafka.Brokers[0] != "k1:9092" || got.Group.SessionTimeout.Duration != 10*time.Second {
			t.Errorf("task %s does not inherit the shared keys: %+v", tk.Name, got)
		}
	}
	// A table can turn off a shared key that has no default: items has no
	// soft-delete column.
	if c.Tasks[0].Cfg.Source.DeletedAtColumn != "" {
		t.Errorf("items deleted_at_column %q", c.Tasks[0].Cfg.Source.DeletedAtColumn)
	}
	if c.Group.RebalanceTimeout.Duration != 60*time.Second || c.Group.TasksTopic != "tidemark-tasks.shop" {
		t.Errorf("group defaults: %+v", c.Group)
	}
	// A single-table config has no tasks and keeps today's behaviour.
	if c := mustLoad(t, writeConfig(t, minimal), nil); len(c.Tasks) != 0 || c.Kafka.Topic != "orders" {
		t.Errorf("single table: tasks %d topic %q", len(c.Tasks), c.Kafka.Topic)
	}
}

func TestTablesConfigErrors(t *testing.T) {
	base := `
name: shop
source:
  dsn: postgres://tidemark@db.example.com:5432/shop?sslmode=require
`
	for _, tc := range []struct{ name, text, want string }{
		{"table and tables", base + "  table: orders\ntables: [a]\n", "source.table: is set together with tables:"},
		{"topic and tables", base + "kafka:\n  topic: t\ntables: [a]\n", "kafka.topic: names one topic"},
		{"empty", base + "tables: []\n", "tables: lists no table"},
		{"not a list", base + "tables: orders\n", "tables: expects a list"},
		{"duplicate", base + "tables: [orders, public.orders]\n", `tables[1]: task name "public.orders" is used twice`},
		{"bad key", base + "tables:\n  - table: a\n    kafka: {topic: x}\n", "tables[0]: kafka is not a key of a table"},
		{"no table", base + "tables:\n  - name: a\n", "tables[0]: names no table"},
		{"bad override", base + "tables:\n  - table: a\n    sync: {page_size: 0}\n", "tables[0].sync.page_size"},
		{"unknown override", base + "tables:\n  - table: a\n    sync: {page_sise: 10}\n", "sync.page_sise: unknown key"},
		{"bad task name", base + "tables:\n  - table: a\n    name: \"a b\"\n", `tables[0]: task name "a b" is not valid`},
		{"http", "name: x\nsource:\n  kind: http\n  dsn: https://x/y\ntables: [a]\n", "tables: is for PostgreSQL sources"},
		// Two tasks publishing to one topic overwrite each other's keys, and
		// each one's sweep tombstones the other's rows as gone.
		{"shared default topic", base + "tables: [orders, {table: orders, name: o2}]\n",
			`tables[1]: topic "public.orders" is also the topic of tables[0]`},
		{"shared explicit topic", base + "tables:\n  - a\n  - table: b\n    topic: public.a\n",
			`tables[1]: topic "public.a" is also the topic of tables[0]`},
		{"shared topic, shard dsn", base + "tables:\n  - {table: orders, name: eu, source: {dsn: \"postgres://t@eu/shop\"}}\n  - {table: orders, name: us, source: {dsn: \"postgres://t@us/shop\"}}\n",
			`tables[1]: topic "public.orders" is also the topic of tables[0]; give one of them a topic:`},
		// The tasks topic is grown to one partition per task: another
		// topic of the connector must not be it.
		{"tasks topic is the offsets topic", base + "group:\n  tasks_topic: tidemark-offsets\ntables: [a]\n",
			`group.tasks_topic: "tidemark-offsets" is also kafka.offsets_topic`},
		{"tasks topic is the ledger topic", base + "kafka:\n  ledger_topic: l\ngroup:\n  tasks_topic: l\ntables: [a]\n",
			`group.tasks_topic: "l" is also kafka.ledger_topic`},
		{"tasks topic is a data topic", base + "group:\n  tasks_topic: public.b\ntables: [a, b]\n",
			`group.tasks_topic: "public.b" is also the topic of tables[1]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := loadErr(t, writeConfig(t, tc.text), nil)
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error\n%s\nlacks %q", msg, tc.want)
			}
		})
	}
	// A problem of a shared key is reported once, not once per table.
	msg := loadErr(t, writeConfig(t, base+"sync:\n  page_size: 0\ntables: [a, b, c]\n"), nil)
	if n := strings.Count(msg, "sync.page_size"); n != 1 {
		t.Errorf("shared problem reported %d times:\n%s", n, msg)
	}
}
