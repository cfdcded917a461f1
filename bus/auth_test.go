package bus_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"
)

// authServer starts a JetStream server with opts (host, port and store
// are filled in).
func authServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(testTimeout) {
		srv.Shutdown()
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// writeFile writes a secret file (mode 0600) under dir and returns its path.
func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// must returns v, panicking on err: for generating test keys and
// certificates, which fails only if the crypto library is broken.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// nkeyUser is a user nkey pair: the public key the server trusts and a
// seed file the client signs with.
func nkeyUser(t *testing.T, dir, name string) (pub, seedFile string, seed []byte) {
	t.Helper()
	kp := must(nkeys.CreateUser())
	seed = must(kp.Seed())
	return must(kp.PublicKey()), writeFile(t, dir, name+".nk", seed), seed
}

// operatorMode is a server trusting one operator, whose account "APP" has
// JetStream, and a creds file (user JWT + seed) of a user of APP.
type operatorMode struct {
	opts      func() *server.Options
	credsFile string
	seed      []byte
}

func newOperatorMode(t *testing.T, dir, name string) operatorMode {
	t.Helper()
	okp := must(nkeys.CreateOperator())
	oc := jwt.NewOperatorClaims(must(okp.PublicKey()))
	oc.Name = "OP"
	ojwt := must(oc.Encode(okp))
	operator := must(jwt.DecodeOperatorClaims(ojwt))

	account := func(name string, js bool) (nkeys.KeyPair, string, string) {
		kp := must(nkeys.CreateAccount())
		pub := must(kp.PublicKey())
		ac := jwt.NewAccountClaims(pub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		return kp, pub, must(ac.Encode(okp))
	}
	_, sysPub, sysJWT := account("SYS", false)
	akp, appPub, appJWT := account("APP", true)

	ukp := must(nkeys.CreateUser())
	uc := jwt.NewUserClaims(must(ukp.PublicKey()))
	uc.Name = "loopbus"
	ujwt := must(uc.Encode(akp))
	seed := must(ukp.Seed())
	creds := must(jwt.FormatUserConfig(ujwt, seed))
	return operatorMode{
		opts: func() *server.Options {
			res := &server.MemAccResolver{}
			if err := res.Store(sysPub, sysJWT); err != nil {
				t.Fatal(err)
			}
			if err := res.Store(appPub, appJWT); err != nil {
				t.Fatal(err)
			}
			return &server.Options{TrustedOperators: []*jwt.OperatorClaims{operator}, SystemAccount: sysPub, AccountResolver: res}
		},
		credsFile: writeFile(t, dir, name+".creds", creds),
		seed:      seed,
	}
}

// pki is a CA with a server certificate for 127.0.0.1 and a client
// certificate, as PEM files.
type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newPKI(t *testing.T, dir, name string) pki {
	t.Helper()
	key := func(file string) *ecdsa.PrivateKey {
		k := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
		der := must(x509.MarshalECPrivateKey(k))
		writeFile(t, dir, file, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
		return k
	}
	now := time.Now()
	caKey := key(name + "-ca.key")
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER := must(x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey))
	caCert := must(x509.ParseCertificate(caDER))
	issue := func(file string, serial int64, tmpl *x509.Certificate) string {
		k := key(file + ".key")
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der := must(x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey))
		return writeFile(t, dir, file+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	}
	return pki{
		ca: writeFile(t, dir, name+"-ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})),
		serverCert: issue(name+"-server", 2, &x509.Certificate{
			Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}),
		serverKey: filepath.Join(dir, name+"-server.key"),
		clientCert: issue(name+"-client", 3, &x509.Certificate{
			Subject: pkix.Name{CommonName: "loopbus-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}),
		clientKey: filepath.Join(dir, name+"-client.key"),
	}
}

// mutualTLS returns server options requiring a client certificate from p's CA.
func mutualTLS(t *testing.T, p pki) *server.Options {
	t.Helper()
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: p.serverCert, KeyFile: p.serverKey, CaFile: p.ca, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	return &server.Options{TLS: true, TLSVerify: true, TLSConfig: tc, TLSTimeout: 5}
}

// Connect authenticates with each method loopbus offers (user/password,
// token, nkey seed file, creds file in JWT operator mode, mutual TLS),
// provisions over it, and fails at once with a clear error that leaks no
// secret when the credentials are wrong or missing.
func TestConnectAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	nkeyPub, nkeyFile, nkeySeed := nkeyUser(t, dir, "alice")
	_, strangerFile, strangerSeed := nkeyUser(t, dir, "stranger")
	op := newOperatorMode(t, dir, "app")
	otherOp := newOperatorMode(t, dir, "other") // a user of an operator the server does not trust
	certs := newPKI(t, dir, "good")
	rogue := newPKI(t, dir, "rogue") // another CA: its server and client certificates are not trusted

	const password, token = "pa55-w0rd-x1", "t0ken-y2-z3"
	users := func() *server.Options {
		return &server.Options{Users: []*server.User{{Username: "alice", Password: password}}}
	}
	tests := []struct {
		name    string
		server  func() *server.Options
		cfg     bus.Config // URL is filled in
		wantErr string     // "" means success; else a substring of the error
		secrets []string   // must not appear in the error
	}{
		{name: "user and password", server: users, cfg: bus.Config{User: "alice", Password: password}},
		{name: "wrong password", server: users, cfg: bus.Config{User: "alice", Password: "guess-" + password}, wantErr: "authorization violation", secrets: []string{password}},
		{name: "no credentials", server: users, cfg: bus.Config{}, wantErr: "authorization violation"},
		{name: "token", server: func() *server.Options { return &server.Options{Authorization: token} }, cfg: bus.Config{Token: token}},
		{name: "wrong token", server: func() *server.Options { return &server.Options{Authorization: token} }, cfg: bus.Config{Token: "x" + token}, wantErr: "authorization violation", secrets: []string{token}},
		{name: "nkey seed file", server: func() *server.Options { return &server.Options{Nkeys: []*server.NkeyUser{{Nkey: nkeyPub}}} }, cfg: bus.Config{NKeyFile: nkeyFile}},
		{name: "unknown nkey", server: func() *server.Options { return &server.Options{Nkeys: []*server.NkeyUser{{Nkey: nkeyPub}}} }, cfg: bus.Config{NKeyFile: strangerFile}, wantErr: "authorization violation", secrets: []string{string(nkeySeed), string(strangerSeed)}},
		{name: "missing nkey file", server: func() *server.Options { return &server.Options{Nkeys: []*server.NkeyUser{{Nkey: nkeyPub}}} }, cfg: bus.Config{NKeyFile: filepath.Join(dir, "nope.nk")}, wantErr: "nope.nk"},
		{name: "creds file (JWT)", server: op.opts, cfg: bus.Config{CredsFile: op.credsFile}},
		{name: "creds of an untrusted operator", server: op.opts, cfg: bus.Config{CredsFile: otherOp.credsFile}, wantErr: "authorization violation", secrets: []string{string(op.seed), string(otherOp.seed)}},
		{name: "mutual TLS", server: func() *server.Options { return mutualTLS(t, certs) }, cfg: bus.Config{TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey}},
		{name: "TLS without client certificate", server: func() *server.Options { return mutualTLS(t, certs) }, cfg: bus.Config{TLSCA: certs.ca}, wantErr: "certificate required"},
		{name: "client certificate of another CA", server: func() *server.Options { return mutualTLS(t, certs) }, cfg: bus.Config{TLSCA: certs.ca, TLSCert: rogue.clientCert, TLSKey: rogue.clientKey}, wantErr: "tls:"},
		{name: "server certificate of an untrusted CA", server: func() *server.Options { return mutualTLS(t, rogue) }, cfg: bus.Config{TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey}, wantErr: "certificate signed by unknown authority"},
		{name: "mutual TLS and password", server: func() *server.Options {
			o := mutualTLS(t, certs)
			o.Users = users().Users
			return o
		}, cfg: bus.Config{User: "alice", Password: password, TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey}},
	}
	for _, tt := range tests {
		for _, inProcess := range []bool{false, true} {
			name := tt.name
			if inProcess {
				name += " in process"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				cfg := tt.cfg
				srv := authServer(t, tt.server())
				cfg.URL = srv.ClientURL()
				if inProcess {
					cfg.InProcess = srv // the same checks, the same answers
				}
				// No ConnectTimeout: a refusal must end Connect by itself, not
				// by retrying until the context ends.
				ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
				defer cancel()
				b, err := bus.Connect(ctx, cfg, "test/auth", catalogue(t), zerolog.Nop())
				if tt.wantErr == "" {
					if err != nil {
						t.Fatalf("Connect: %v", err)
					}
					defer b.Close()
					// Provisioned and usable over this connection.
					if _, err := b.Publish(ctx, jobStarted("auth-1", "e1")); err != nil {
						t.Fatalf("Publish: %v", err)
					}
					return
				}
				if err == nil {
					b.Close()
					t.Fatalf("Connect succeeded, want an error containing %q", tt.wantErr)
				}
				t.Logf("error: %v", err)
				if errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Connect retried until the deadline instead of failing at once: %v", err)
				}
				if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tt.wantErr)) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				for _, s := range tt.secrets {
					if strings.Contains(err.Error(), strings.TrimSpace(s)) {
						t.Errorf("error leaks a secret: %v", err)
					}
				}
			})
		}
	}
}

// lockedBuffer is a log sink safe for the NATS client's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A user without the permission to look up or create the streams and
// buckets gets, at once, an error wrapping ErrPermissionDenied that names
// the refused subject; a user allowed only to look them up connects once
// an admin has created them, and a publish it is not allowed is refused
// and logged with the subject.
func TestConnectPermissions(t *testing.T) {
	t.Parallel()
	lookup := []string{"$JS.API.STREAM.INFO.LOOPBUS", "$JS.API.STREAM.INFO.LOOPBUS_DLQ", "$JS.API.STREAM.INFO.KV_LOOPBUS_VIEWS", "$JS.API.STREAM.INFO.KV_LOOPBUS_WORKERS", "$JS.API.STREAM.INFO.LOOPBUS_ARTIFACTS"}
	user := func(name string, pub ...string) *server.User {
		return &server.User{Username: name, Password: name + "-pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: pub},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}}
	}
	url := authServer(t, &server.Options{Users: []*server.User{
		{Username: "admin", Password: "admin-pw"},
		user("reader", lookup...),
		user("blind", "loopbus.evt.>"),
		user("worker", append([]string{"loopbus.evt.*.job.started"}, lookup...)...),
	}}).ClientURL()
	cat := catalogue(t)
	connect := func(t *testing.T, name string, log zerolog.Logger) (*bus.Bus, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		return bus.Connect(ctx, bus.Config{URL: url, User: name, Password: name + "-pw"}, "test/"+name, cat, log)
	}

	before := []struct {
		name, user, wantErr string
	}{
		{name: "may not create", user: "reader", wantErr: `Permissions Violation for Publish to "$JS.API.STREAM.CREATE.LOOPBUS"`},
		{name: "may not look up", user: "blind", wantErr: `Permissions Violation for Publish to "$JS.API.STREAM.INFO.LOOPBUS"`},
	}
	for _, tt := range before {
		t.Run("before provisioning/"+tt.name, func(t *testing.T) {
			start := time.Now()
			b, err := connect(t, tt.user, zerolog.Nop())
			if err == nil {
				b.Close()
				t.Fatal("Connect succeeded without the permission to provision")
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, bus.ErrPermissionDenied) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q: want ErrPermissionDenied naming %s", err, tt.wantErr)
			}
			// The server's refusal ends Connect, not a request timeout (5s).
			if d := time.Since(start); d > 4*time.Second {
				t.Errorf("Connect took %s to report the refusal", d)
			}
		})
	}

	admin, err := connect(t, "admin", zerolog.Nop())
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	defer admin.Close()
	before0 := msgCount(t, admin)

	t.Run("after provisioning", func(t *testing.T) {
		logs := &lockedBuffer{}
		w, err := connect(t, "worker", zerolog.New(logs))
		if err != nil {
			t.Fatalf("worker: %v", err)
		}
		defer w.Close()
		if _, err := w.Publish(ctxT(t), jobStarted("perm-1", "ok-1")); err != nil {
			t.Fatalf("allowed publish: %v", err)
		}
		// The refusal ends the publish (after the first unanswered attempt)
		// rather than retrying until the context ends.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := w.Publish(ctx, jobRequested("perm-1", "forged-1")); !errors.Is(err, bus.ErrPermissionDenied) || ctx.Err() != nil {
			t.Fatalf("forbidden publish = %v (ctx %v), want ErrPermissionDenied before the context ends", err, ctx.Err())
		}
		want := `Permissions Violation for Publish to \"loopbus.evt.perm-1.job.requested\"`
		waitFor(t, testTimeout, "the refusal in the log", func() bool { return strings.Contains(logs.String(), want) })
		if got := msgCount(t, admin); got != before0+1 {
			t.Errorf("stream holds %d events, want %d (only the allowed one)", got, before0+1)
		}
	})

	// A deployment upgraded without provisioning the presence bucket: a
	// user that may not create it still connects, with presence off.
	t.Run("without the presence bucket", func(t *testing.T) {
		if err := admin.JetStream().DeleteKeyValue(ctxT(t), bus.DefaultWorkersBucket); err != nil {
			t.Fatal(err)
		}
		r, err := connect(t, "reader", zerolog.Nop())
		if err != nil {
			t.Fatalf("reader without the presence bucket: %v", err)
		}
		defer r.Close()
		if _, err := r.Workers(ctxT(t)); !errors.Is(err, bus.ErrNoPresence) {
			t.Errorf("Workers = %v, want ErrNoPresence", err)
		}
	})
}
