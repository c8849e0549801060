// Package deploy_test checks the deployment files that cannot run here (no
// Docker engine, no Kubernetes): they parse, hold the expected kinds and
// fields, agree on the metrics port, and reference only metrics that
// package metrics registers. cmd/tidemark/deploy_config_test.go loads the
// tidemark configurations they ship with the real configuration loader.
package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/metrics"
)

func readYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	return docs
}

// get walks a path of map keys and list indexes.
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string { s, _ := v.(string); return s }

// registered exercises every Observer method and the sweep, verify and
// readiness APIs, then returns the tidemark metric families by name.
func registered(t *testing.T) map[string]dto.MetricType {
	t.Helper()
	m := metrics.New(metrics.Config{Connector: "c"})
	m.AddCheck("kafka", func(context.Context) error { return nil })
	now := time.Now()
	m.ObserveCheckpoint(now.Add(-time.Hour), now.Add(-time.Minute))
	m.ObservePage(time.Millisecond, 2)
	m.ObservePage(time.Millisecond, 0)
	m.ObserveCommit(connector.CommitInfo{Seq: 1, Took: time.Millisecond, Span: time.Millisecond, Published: 2,
		Watermark: now, NewestUpdatedAt: now, CommittedAt: now, PassEnded: true})
	m.ObserveAbort()
	m.ObserveRetry("kafka")
	m.ObserveStop("safety_stop")
	m.SweepResult(1, 1)
	m.VerifyResult(true, 0, 0, 0)
	m.ObserveNotify(func() int64 { return 1 }, func() int64 { return 0 })
	m.Ready(context.Background())
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	// A member of a configuration with tables adds the group's series
	// (docs/scale-out.md).
	g := metrics.NewGroup("c", "v")
	g.ObserveAssigned(1)
	g.ObserveRevoked(1)
	g.ObserveLost(1)
	g.ObserveTaskStop()
	gfams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dto.MetricType{}
	for _, f := range append(fams, gfams...) {
		if strings.HasPrefix(f.GetName(), "tidemark_") {
			out[f.GetName()] = f.GetType()
		}
	}
	return out
}

var metricRE = regexp.MustCompile(`\btidemark_[a-z0-9_]+`)

// checkExprs checks that every tidemark_* name in the PromQL expressions is
// a registered family, or a histogram's _bucket, _sum or _count series.
func checkExprs(t *testing.T, where string, exprs []string, fams map[string]dto.MetricType) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	if len(exprs) == 0 {
		t.Errorf("%s: no expressions found", where)
	}
	for _, e := range exprs {
		for _, name := range metricRE.FindAllString(e, -1) {
			if _, ok := fams[name]; ok {
				used[name] = true
				continue
			}
			found := false
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suf); ok && fams[base] == dto.MetricType_HISTOGRAM {
					used[base], found = true, true
				}
			}
			if !found {
				t.Errorf("%s: %q uses %s, which package metrics does not register", where, e, name)
			}
		}
	}
	return used
}

// exprs collects every "expr" and "query" string in a JSON or YAML tree.
func exprs(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if s, ok := val.(string); ok && (k == "expr" || (k == "query" && strings.Contains(s, "tidemark_"))) {
				out = append(out, s)
				continue
			}
			out = append(out, exprs(val)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, exprs(e)...)
		}
	}
	return out
}

func TestDashboardReferencesRegisteredMetrics(t *testing.T) {
	fams := registered(t)
	b, err := os.ReadFile("grafana/dashboards/tidemark.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if dash["uid"] != "tidemark" || dash["title"] == "" {
		t.Errorf("dashboard uid/title: %v %v", dash["uid"], dash["title"])
	}
	used := checkExprs(t, "dashboard", exprs(dash), fams)
	// The dashboard shows the key series of the issue.
	for _, name := range []string{"tidemark_rows_read_total", "tidemark_rows_published_total", "tidemark_rows_deduped_total",
		"tidemark_rows_tombstoned_total", "tidemark_transactions_committed_total", "tidemark_transactions_aborted_total",
		"tidemark_page_fetch_duration_seconds", "tidemark_transaction_duration_seconds", "tidemark_watermark_lag_seconds",
		"tidemark_source_to_topic_latency_seconds", "tidemark_checkpoint_age_seconds", "tidemark_retries_total",
		"tidemark_stops_total", "tidemark_sweep_tombstoned_total", "tidemark_verify_discrepancies", "tidemark_ready"} {
		if !used[name] {
			t.Errorf("the dashboard does not show %s", name)
		}
	}
	// Panels do not overlap and fit the 24-column grid.
	type box struct{ x, y, w, h float64 }
	var boxes []box
	for _, p := range dash["panels"].([]any) {
		g := get(p, "gridPos").(map[string]any)
		bx := box{g["x"].(float64), g["y"].(float64), g["w"].(float64), g["h"].(float64)}
		if bx.x+bx.w > 24 {
			t.Errorf("panel %v is wider than the grid", get(p, "title"))
		}
		for _, o := range boxes {
			if bx.x < o.x+o.w && o.x < bx.x+bx.w && bx.y < o.y+o.h && o.y < bx.y+bx.h {
				t.Errorf("panel %v overlaps another", get(p, "title"))
			}
		}
		boxes = append(boxes, bx)
	}
}

func TestAlertsReferenceRegisteredMetrics(t *testing.T) {
	fams := registered(t)
	prom := readYAML(t, "prometheus/alerts.yml")
	k8s := readYAML(t, "kubernetes/prometheusrule.yaml")
	a := exprs(prom[0])
	checkExprs(t, "prometheus/alerts.yml", a, fams)
	b := exprs(get(k8s[0], "spec"))
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		t.Errorf("kubernetes/prometheusrule.yaml and prometheus/alerts.yml hold different rules:\n%q\n%q", a, b)
	}
}

// TestOperatingDocListsEveryMetric: docs/operating.md documents each
// registered tidemark metric.
func TestOperatingDocListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range registered(t) {
		if !bytes.Contains(doc, []byte("`"+name+"`")) && !bytes.Contains(doc, []byte("`"+name+"{")) {
			t.Errorf("docs/operating.md does not list `%s`", name)
		}
	}
	// The doc also names the SQL objects of source.notify's trigger, which
	// are not metrics.
	var names []string
	for _, n := range metricRE.FindAllString(string(doc), -1) {
		if n != "tidemark_notify" && n != "tidemark_notify_" {
			names = append(names, n)
		}
	}
	checkExprs(t, "docs/operating.md", names, registered(t))
}

func TestCompose(t *testing.T) {
	docs := readYAML(t, "docker-compose.yml")
	services, _ := get(docs[0], "services").(map[string]any)
	for _, name := range []string{"kafka", "postgres", "tidemark", "prometheus", "grafana"} {
		if services[name] == nil {
			t.Errorf("compose lacks service %s", name)
		}
	}
	kafka := services["kafka"]
	if !strings.HasPrefix(str(get(kafka, "image")), "apache/kafka:") {
		t.Errorf("kafka image %v, want apache/kafka", get(kafka, "image"))
	}
	if roles := str(get(kafka, "environment", "KAFKA_PROCESS_ROLES")); !strings.Contains(roles, "controller") || !strings.Contains(roles, "broker") {
		t.Errorf("kafka is not a KRaft broker+controller: %q", roles)
	}
	tm := services["tidemark"]
	if str(get(tm, "build", "dockerfile")) != "deploy/Dockerfile" || str(get(tm, "build", "context")) != ".." {
		t.Errorf("tidemark build: %v", get(tm, "build"))
	}
	if str(get(tm, "ports", 0)) != "127.0.0.1:9464:9464" {
		t.Errorf("tidemark ports: %v", get(tm, "ports"))
	}
	// Every bind-mounted file exists.
	for name, svc := range services {
		vols, _ := get(svc, "volumes").([]any)
		for _, v := range vols {
			src, _, _ := strings.Cut(str(v), ":")
			if strings.HasPrefix(src, "./") {
				if _, err := os.Stat(src); err != nil {
					t.Errorf("service %s mounts %s: %v", name, src, err)
				}
			}
		}
	}
	// Prometheus scrapes tidemark on the port its config listens on.
	prom := readYAML(t, "prometheus/prometheus.yml")[0]
	target := str(get(prom, "scrape_configs", 0, "static_configs", 0, "targets", 0))
	if target != "tidemark:9464" {
		t.Errorf("prometheus scrapes %q, want tidemark:9464", target)
	}
	listen := str(get(readYAML(t, "tidemark.yaml")[0], "metrics", "listen"))
	if _, port, _ := strings.Cut(listen, ":"); !strings.HasSuffix(target, ":"+port) {
		t.Errorf("tidemark.yaml listens on %q, prometheus scrapes %q", listen, target)
	}
	if str(get(prom, "rule_files", 0)) != "/etc/prometheus/alerts.yml" {
		t.Errorf("prometheus rule_files: %v", get(prom, "rule_files"))
	}
	ds := readYAML(t, "grafana/provisioning/datasources/prometheus.yml")[0]
	if str(get(ds, "datasources", 0, "uid")) != "prometheus" || str(get(ds, "datasources", 0, "url")) != "http://prometheus:9090" {
		t.Errorf("grafana datasource: %v", ds)
	}
	prov := readYAML(t, "grafana/provisioning/dashboards/tidemark.yml")[0]
	if str(get(prov, "providers", 0, "options", "path")) != "/var/lib/grafana/dashboards" {
		t.Errorf("grafana dashboard provider path: %v", prov)
	}
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if strings.Count(s, "\nFROM ") < 2 {
		t.Errorf("not a multi-stage build")
	}
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/tidemark", "distroless/static", "USER 65532:65532", "EXPOSE 9464"} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

func TestKubernetesManifests(t *testing.T) {
	kinds := map[string]map[string]any{}
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		for _, d := range readYAML(t, f) {
			if str(d["apiVersion"]) == "" || str(get(d, "metadata", "name")) == "" {
				t.Errorf("%s: a document without apiVersion or metadata.name", f)
			}
			kinds[str(d["kind"])] = d
		}
	}
	for _, k := range []string{"Deployment", "ConfigMap", "Secret", "Service", "ServiceMonitor", "PrometheusRule"} {
		if kinds[k] == nil {
			t.Fatalf("no %s manifest", k)
		}
	}
	dep := kinds["Deployment"]
	if r, _ := get(dep, "spec", "replicas").(int); r != 1 {
		t.Errorf("replicas %v, want 1 (one instance per connector: the transactional id fences a second)", get(dep, "spec", "replicas"))
	}
	if str(get(dep, "spec", "strategy", "type")) != "Recreate" {
		t.Errorf("strategy %v, want Recreate", get(dep, "spec", "strategy"))
	}
	pod := get(dep, "spec", "template", "spec")
	if get(pod, "securityContext", "runAsNonRoot") != true {
		t.Errorf("pod does not run as non-root")
	}
	c := get(pod, "containers", 0)
	if str(get(c, "livenessProbe", "httpGet", "path")) != "/healthz" || str(get(c, "readinessProbe", "httpGet", "path")) != "/readyz" {
		t.Errorf("probes: %v %v", get(c, "livenessProbe"), get(c, "readinessProbe"))
	}
	if get(c, "ports", 0, "containerPort") != 9464 || str(get(c, "ports", 0, "name")) != "metrics" {
		t.Errorf("container ports: %v", get(c, "ports"))
	}
	if get(c, "securityContext", "readOnlyRootFilesystem") != true || get(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Errorf("container securityContext: %v", get(c, "securityContext"))
	}
	// The config and secrets the container mounts are the ConfigMap and
	// Secret shipped, and every file the config names is in the Secret.
	cm, sec := kinds["ConfigMap"], kinds["Secret"]
	var cmName, secName string
	vols, _ := get(pod, "volumes").([]any)
	for _, v := range vols {
		if n := str(get(v, "configMap", "name")); n != "" {
			cmName = n
		}
		if n := str(get(v, "secret", "secretName")); n != "" {
			secName = n
		}
	}
	if cmName != str(get(cm, "metadata", "name")) || secName != str(get(sec, "metadata", "name")) {
		t.Errorf("deployment mounts ConfigMap %q and Secret %q; shipped %q and %q", cmName, secName, get(cm, "metadata", "name"), get(sec, "metadata", "name"))
	}
	conf := str(get(cm, "data", "tidemark.yaml"))
	for _, m := range regexp.MustCompile(`/etc/tidemark/secrets/([a-z.-]+)`).FindAllStringSubmatch(conf, -1) {
		if get(sec, "stringData", m[1]) == nil {
			t.Errorf("the config names secret file %s, which the Secret lacks", m[1])
		}
	}
	// Service and ServiceMonitor agree on labels and the port name.
	svc, sm := kinds["Service"], kinds["ServiceMonitor"]
	if str(get(svc, "spec", "ports", 0, "name")) != str(get(sm, "spec", "endpoints", 0, "port")) {
		t.Errorf("ServiceMonitor port %v, Service port %v", get(sm, "spec", "endpoints", 0, "port"), get(svc, "spec", "ports", 0, "name"))
	}
	for k, v := range get(sm, "spec", "selector", "matchLabels").(map[string]any) {
		if get(svc, "metadata", "labels", k) != v {
			t.Errorf("ServiceMonitor selects %s=%v; the Service is labelled %v", k, v, get(svc, "metadata", "labels"))
		}
	}
	for k, v := range get(svc, "spec", "selector").(map[string]any) {
		if get(dep, "spec", "template", "metadata", "labels", k) != v {
			t.Errorf("Service selects %s=%v; the pod template lacks it", k, v)
		}
	}
	if str(get(sm, "spec", "endpoints", 0, "path")) != "/metrics" {
		t.Errorf("ServiceMonitor path %v", get(sm, "spec", "endpoints", 0, "path"))
	}
}

// Item 7 of issue 14: the pod can read its secrets, images are pinned, and
// the demo publishes its ports on loopback only.
func TestPodReadsItsSecrets(t *testing.T) {
	var dep map[string]any
	for _, d := range readYAML(t, "kubernetes/deployment.yaml") {
		if str(d["kind"]) == "Deployment" {
			dep = d
		}
	}
	pod := get(dep, "spec", "template", "spec")
	uid, _ := get(pod, "securityContext", "runAsUser").(int)
	gid, _ := get(pod, "securityContext", "runAsGroup").(int)
	fsGroup, ok := get(pod, "securityContext", "fsGroup").(int)
	if !ok || fsGroup != gid || uid == 0 {
		t.Fatalf("pod securityContext: runAsUser %v, runAsGroup %v, fsGroup %v: secret files are root-owned with group fsGroup, so fsGroup must be the container's group", uid, gid, get(pod, "securityContext", "fsGroup"))
	}
	vols, _ := get(pod, "volumes").([]any)
	found := false
	for _, v := range vols {
		if get(v, "secret") == nil {
			continue
		}
		found = true
		mode, ok := get(v, "secret", "defaultMode").(int)
		if !ok {
			mode = 0o644
		}
		// The files are owned by root and group fsGroup: the container's
		// user reads them through the group bits; nobody else may.
		if mode&0o040 == 0 || mode&0o007 != 0 {
			t.Errorf("secret volume %v: defaultMode %#o; want group-readable and not world-readable, e.g. 0440", get(v, "name"), mode)
		}
	}
	if !found {
		t.Fatal("no secret volume")
	}
}

var digestRE = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)

func TestImagesPinned(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	froms := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			froms++
			if !digestRE.MatchString(f[1]) {
				t.Errorf("Dockerfile: %q is not pinned by digest (image:tag@sha256:...)", line)
			}
		}
	}
	if froms < 2 {
		t.Errorf("Dockerfile has %d FROM lines", froms)
	}
	var images []string
	for _, f := range []string{"docker-compose.yml", "kubernetes/deployment.yaml"} {
		for _, d := range readYAML(t, f) {
			var walk func(v any)
			walk = func(v any) {
				switch x := v.(type) {
				case map[string]any:
					for k, val := range x {
						if s, ok := val.(string); ok && k == "image" {
							images = append(images, f+": "+s)
						}
						walk(val)
					}
				case []any:
					for _, e := range x {
						walk(e)
					}
				}
			}
			walk(d)
		}
	}
	if len(images) < 5 {
		t.Fatalf("found only %v", images)
	}
	for _, img := range images {
		ref := img[strings.Index(img, ": ")+2:]
		name, tag, ok := strings.Cut(strings.SplitN(ref, "@", 2)[0][strings.LastIndex(ref, "/")+1:], ":")
		if !ok || tag == "" || tag == "latest" {
			t.Errorf("%s: %s has no version tag (or :latest)", img, name)
		}
	}
}

func TestComposePortsOnLoopback(t *testing.T) {
	services, _ := get(readYAML(t, "docker-compose.yml")[0], "services").(map[string]any)
	n := 0
	for name, svc := range services {
		ports, _ := get(svc, "ports").([]any)
		for _, p := range ports {
			n++
			if !strings.HasPrefix(str(p), "127.0.0.1:") {
				t.Errorf("service %s publishes %q on every interface; bind it to 127.0.0.1", name, p)
			}
		}
	}
	if n < 3 {
		t.Errorf("found %d published ports", n)
	}
}
