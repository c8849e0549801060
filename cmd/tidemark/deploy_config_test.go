package main

import (
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDeployConfigs loads the configurations deploy/ ships (compose and the
// Kubernetes ConfigMap) with the real loader: they must validate.
func TestDeployConfigs(t *testing.T) {
	env := func(string) string { return "" }
	c, err := LoadConfig("../../deploy/tidemark.yaml", env, nil)
	if err != nil {
		t.Fatalf("deploy/tidemark.yaml: %v", err)
	}
	if c.Metrics.Listen != "0.0.0.0:9464" || c.Source.PasswordEnv == "" {
		t.Errorf("deploy/tidemark.yaml: metrics.listen %q, source.password_env %q", c.Metrics.Listen, c.Source.PasswordEnv)
	}

	k := loadConfigMap(t, "../../deploy/kubernetes/configmap.yaml")
	if len(k.Tasks) != 0 {
		t.Errorf("the single-table ConfigMap has %d tasks", len(k.Tasks))
	}
	// The task-mode ConfigMap (docs/scale-out.md): its 12 tables are tasks.
	tm := loadConfigMap(t, "../../deploy/kubernetes/task-mode/configmap.yaml")
	if len(tm.Tasks) != 12 || tm.Metrics.Listen == "" {
		t.Errorf("the task-mode ConfigMap has %d tasks (want 12), metrics.listen %q", len(tm.Tasks), tm.Metrics.Listen)
	}
	if !k.Kafka.TLS.On() || k.Kafka.SASL.Mechanism != "SCRAM-SHA-512" || k.Kafka.SASL.PasswordFile == "" || k.Source.PasswordFile == "" {
		t.Errorf("the Kubernetes config should use TLS, SCRAM and password files: %+v %+v", k.Kafka.TLS, k.Kafka.SASL)
	}
	if w := postgresTLSWarning(k.Source.DSN, env); w != "" {
		t.Errorf("the Kubernetes config draws the PostgreSQL TLS warning: %s", w)
	}
}

// loadConfigMap loads the tidemark.yaml of a Kubernetes ConfigMap.
func loadConfigMap(t *testing.T, file string) *Config {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tidemark.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["tidemark.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path, func(string) string { return "" }, nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return c
}
