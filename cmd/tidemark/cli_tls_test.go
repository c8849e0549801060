package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/test/tlsca"
)

// renewFile writes b to dir/name as a renewal does (a new file renamed
// over the old: cert-manager, a Kubernetes secret volume) and returns its
// path.
func renewFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
	return p
}

// tlsOpts is the Kafka client options of a configuration whose kafka
// section is kafka.brokers broker and the kafka.tls lines given.
func tlsOpts(t *testing.T, dir, broker, tlsLines string) []kgo.Opt {
	t.Helper()
	text := fmt.Sprintf("name: tls-sync\nsource:\n  dsn: postgres://u@127.0.0.1:1/d\n  table: items\nkafka:\n  brokers: [%s]\n  topic: t\n  tls:\n    enabled: true\n%s", broker, tlsLines)
	path := renewFile(t, dir, "tls.yaml", []byte(text))
	opts, err := loadedCLI(t, path).securityOpts()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// TestSecurityTLSClientCertificateRotation: kafka.tls with a CA file and a
// client certificate against a broker that requires one. The certificate
// and key files are rotated while tidemark runs (cert-manager, a Strimzi
// KafkaUser renewal), and the broker then accepts only the new
// certificate: the connections tidemark opens next present the new one,
// read from the files at each handshake, without a restart.
func TestSecurityTLSClientCertificateRotation(t *testing.T) {
	ca := tlsca.New(t, "tidemark test CA")
	srvCert, srvKey := ca.Issue(t, "broker")
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	var allowed atomic.Value // the client CN the broker accepts
	allowed.Store("tidemark-1")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{
		Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots, MinVersion: tls.VersionTLS12,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if cn := chains[0][0].Subject.CommonName; cn != allowed.Load().(string) {
				return fmt.Errorf("client certificate %q is no longer accepted", cn)
			}
			return nil
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	dir := t.TempDir()
	c1, k1 := ca.Issue(t, "tidemark-1")
	caFile, certFile, keyFile := renewFile(t, dir, "ca.pem", ca.PEM), renewFile(t, dir, "tls.crt", c1), renewFile(t, dir, "tls.key", k1)
	opts := tlsOpts(t, dir, c.ListenAddrs()[0], fmt.Sprintf("    ca_file: %s\n    cert_file: %s\n    key_file: %s\n", caFile, certFile, keyFile))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func() error { return kafkaPing(ctx, opts, c.ListenAddrs()) }
	if err := connect(); err != nil {
		t.Fatalf("connect with the first certificate: %v", err)
	}
	c2, k2 := ca.Issue(t, "tidemark-2")
	renewFile(t, dir, "tls.crt", c2)
	renewFile(t, dir, "tls.key", k2)
	allowed.Store("tidemark-2")
	if err := connect(); err != nil {
		t.Fatalf("connect after the certificate files were rotated, with the same options: %v (the certificate was read once, at start)", err)
	}
	// A key that does not match the certificate (the files caught half
	// way) fails that handshake only, and says which files.
	renewFile(t, dir, "tls.key", k1)
	if err := connect(); err == nil {
		t.Fatal("connected with a key that does not match the certificate")
	} else if !strings.Contains(err.Error(), "kafka.tls.cert_file") {
		t.Fatalf("a key that does not match the certificate: %v; want an error naming kafka.tls.cert_file", err)
	}
}

// TestSecurityTLSCAFileRotation: the brokers move to certificates of a new
// CA, and kafka.tls.ca_file is renewed in place: the connections tidemark
// opens next trust the new CA, read from the file at each dial, without a
// restart. A CA file caught half way fails that dial only, and says which
// file.
func TestSecurityTLSCAFileRotation(t *testing.T) {
	ca1, ca2 := tlsca.New(t, "tidemark test CA 1"), tlsca.New(t, "tidemark test CA 2")
	var serving atomic.Pointer[tls.Certificate] // the broker's certificate
	cert1, key1 := ca1.Issue(t, "broker")
	pair1, err := tls.X509KeyPair(cert1, key1)
	if err != nil {
		t.Fatal(err)
	}
	serving.Store(&pair1)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return serving.Load(), nil
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	dir := t.TempDir()
	caFile := renewFile(t, dir, "ca.pem", ca1.PEM)
	opts := tlsOpts(t, dir, c.ListenAddrs()[0], fmt.Sprintf("    ca_file: %s\n", caFile))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func() error { return kafkaPing(ctx, opts, c.ListenAddrs()) }
	if err := connect(); err != nil {
		t.Fatalf("connect with the first CA: %v", err)
	}
	cert2, key2 := ca2.Issue(t, "broker")
	pair2, err := tls.X509KeyPair(cert2, key2)
	if err != nil {
		t.Fatal(err)
	}
	serving.Store(&pair2)
	if err := connect(); err == nil {
		t.Fatal("connected to a broker whose certificate no CA in kafka.tls.ca_file signed")
	}
	renewFile(t, dir, "ca.pem", ca2.PEM)
	if err := connect(); err != nil {
		t.Fatalf("connect after the CA file was renewed, with the same options: %v (the CA file was read once, at start)", err)
	}
	renewFile(t, dir, "ca.pem", []byte("not PEM"))
	if err := connect(); err == nil {
		t.Fatal("connected with a CA file that holds no certificate")
	} else if !strings.Contains(err.Error(), "kafka.tls.ca_file") {
		t.Fatalf("a CA file that holds no certificate: %v; want an error naming kafka.tls.ca_file", err)
	}
}
