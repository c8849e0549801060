package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// testCA is a throwaway certificate authority for TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tidemark test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key signed by the CA, for a server
// on 127.0.0.1 or a client named cn.
func (ca *testCA) issue(t *testing.T, cn string, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestSecurityTLSClientCertificateRotation: kafka.tls with a CA file and a
// client certificate against a broker that requires one. The certificate
// and key files are rotated while tidemark runs (cert-manager, a Strimzi
// KafkaUser renewal), and the broker then accepts only the new
// certificate: the connections tidemark opens next present the new one,
// read from the files at each handshake, without a restart.
func TestSecurityTLSClientCertificateRotation(t *testing.T) {
	ca := newTestCA(t)
	srvCert, srvKey := ca.issue(t, "broker", 10)
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
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
	write := func(name string, b []byte) string {
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
	c1, k1 := ca.issue(t, "tidemark-1", 11)
	caFile, certFile, keyFile := write("ca.pem", ca.pem), write("tls.crt", c1), write("tls.key", k1)
	path := filepath.Join(dir, "tls.yaml")
	text := fmt.Sprintf("name: tls-sync\nsource:\n  dsn: postgres://u@127.0.0.1:1/d\n  table: items\nkafka:\n  brokers: [%s]\n  topic: t\n  tls:\n    enabled: true\n    ca_file: %s\n    cert_file: %s\n    key_file: %s\n",
		c.ListenAddrs()[0], caFile, certFile, keyFile)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := loadedCLI(t, path).securityOpts()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func() error { return kafkaPing(ctx, opts, c.ListenAddrs()) }
	if err := connect(); err != nil {
		t.Fatalf("connect with the first certificate: %v", err)
	}
	c2, k2 := ca.issue(t, "tidemark-2", 12)
	write("tls.crt", c2)
	write("tls.key", k2)
	allowed.Store("tidemark-2")
	if err := connect(); err != nil {
		t.Fatalf("connect after the certificate files were rotated, with the same options: %v (the certificate was read once, at start)", err)
	}
	// A key that does not match the certificate (the files caught half
	// way) fails that handshake only, and says which files.
	write("tls.key", k1)
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
	ca1, ca2 := newTestCA(t), newTestCA(t)
	var serving atomic.Pointer[tls.Certificate] // the broker's certificate
	cert1, key1 := ca1.issue(t, "broker", 20)
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
	caFile := filepath.Join(dir, "ca.pem")
	writeCA := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(caFile+".new", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(caFile+".new", caFile); err != nil {
			t.Fatal(err)
		}
	}
	writeCA(ca1.pem)
	path := filepath.Join(dir, "tls.yaml")
	text := fmt.Sprintf("name: tls-ca\nsource:\n  dsn: postgres://u@127.0.0.1:1/d\n  table: items\nkafka:\n  brokers: [%s]\n  topic: t\n  tls:\n    enabled: true\n    ca_file: %s\n",
		c.ListenAddrs()[0], caFile)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := loadedCLI(t, path).securityOpts()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func() error { return kafkaPing(ctx, opts, c.ListenAddrs()) }
	if err := connect(); err != nil {
		t.Fatalf("connect with the first CA: %v", err)
	}
	cert2, key2 := ca2.issue(t, "broker", 21)
	pair2, err := tls.X509KeyPair(cert2, key2)
	if err != nil {
		t.Fatal(err)
	}
	serving.Store(&pair2)
	if err := connect(); err == nil {
		t.Fatal("connected to a broker whose certificate no CA in kafka.tls.ca_file signed")
	}
	writeCA(ca2.pem)
	if err := connect(); err != nil {
		t.Fatalf("connect after the CA file was renewed, with the same options: %v (the CA file was read once, at start)", err)
	}
	writeCA([]byte("not PEM"))
	if err := connect(); err == nil {
		t.Fatal("connected with a CA file that holds no certificate")
	} else if !strings.Contains(err.Error(), "kafka.tls.ca_file") {
		t.Fatalf("a CA file that holds no certificate: %v; want an error naming kafka.tls.ca_file", err)
	}
}
