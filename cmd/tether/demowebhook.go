package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/tether-dev/tether/internal/standin"
	"github.com/tether-dev/tether/tunnel/client"
	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// The demo's webhook: a GitHub push, signed as GitHub signs it, so that the
// stand-in can show that a delivery from the buffer arrives byte for byte.
const (
	demoWebhookPath   = "/webhooks/push"
	demoWebhookEvent  = "push"
	demoWebhookBody   = `{"ref":"refs/heads/main","repository":{"full_name":"demo/app"}}`
	demoWebhookSecret = "demo-webhook-secret" //nolint:gosec // the stand-ins' shared secret: it signs the demo's push and guards nothing
)

// webhookTimeout bounds the demo's POST: the public entry waits a few
// seconds for a reconnecting client before it stores the request.
const webhookTimeout = 20 * time.Second

// webhookSignature is GitHub's X-Hub-Signature-256 of body.
func webhookSignature(body []byte) string {
	mac := hmac.New(sha256.New, []byte(demoWebhookSecret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// postWebhook POSTs the demo's webhook to tunnel through the public entry
// and returns the X-Tether-Buffered ID of the 202 that says tether stored
// it.
func postWebhook(ctx context.Context, entry, tunnel string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, webhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, entry+demoWebhookPath, strings.NewReader(demoWebhookBody))
	if err != nil {
		return "", err
	}
	req.Host = tunnel + "." + demoDomain
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", demoWebhookEvent)
	req.Header.Set("X-Hub-Signature-256", webhookSignature([]byte(demoWebhookBody)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("POST %s: %w", demoWebhookPath, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	id := resp.Header.Get(webhook.BufferedHeader)
	if resp.StatusCode != http.StatusAccepted || id == "" {
		return "", fmt.Errorf("POST %s while the client was stopped: got %s with %s %q, want 202 Accepted with an ID: %s",
			demoWebhookPath, resp.Status, webhook.BufferedHeader, id, bytes.TrimSpace(answer))
	}
	return id, nil
}

// webhookDuringOutage shows the first half of store and forward: the
// client first serves the tunnel until it is ready (the server buffers
// only for a tunnel it saw log in with a buffered route) and is stopped,
// then the demo's webhook is POSTed to the tunnel, and the server stores
// it. It returns the stored request's ID, which the stand-in receives once
// a client serves the tunnel again (printDelivered).
func webhookDuringOutage(ctx context.Context, out io.Writer, first *client.Client, entry, tunnel string) (string, error) {
	var lc net.ListenConfig
	health, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen for the demo client's health endpoints: %w", err)
	}
	firstCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- first.Serve(firstCtx, health)
		stop() // a client that failed ends the wait for it
	}()
	err = waitTunnelReady(firstCtx, "http://"+health.Addr().String())
	stop()
	if serveErr := <-served; serveErr != nil && !errors.Is(serveErr, context.Canceled) {
		err = serveErr
	}
	if err != nil {
		return "", err
	}

	fmt.Fprintf(out, "A webhook outlives an outage of the tunnel (store and forward):\n  %s  ->  ", outageSteps()[0])
	id, err := postWebhook(ctx, entry, tunnel)
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprint(out, "failed")
		}
		fmt.Fprintln(out)
		return "", err
	}
	fmt.Fprintf(out, "202 Accepted, %s: %s\n", webhook.BufferedHeader, id)
	return id, nil
}

// printDelivered ends what webhookDuringOutage began: the stand-in
// received the stored webhook from the client that serves the tunnel again.
func printDelivered(out io.Writer, d delivery) {
	signature := "signature valid"
	if !d.signed {
		signature = "signature INVALID: the body changed on the way"
	}
	fmt.Fprintf(out, "  %s  ->  %s: %s (attempt %s), %s\n\n", outageSteps()[1], webhook.DeliveryHeader, d.id, d.attempt, signature)
}

// outageSteps are what happens in the two lines of the outage, padded to
// one width so that their outcomes line up.
func outageSteps() [2]string {
	steps := [2]string{
		fmt.Sprintf("client stopped, POST %s (X-GitHub-Event: %s)", demoWebhookPath, demoWebhookEvent),
		"client started, the Argo Events stand-in received it",
	}
	width := max(len(steps[0]), len(steps[1]))
	for i, s := range steps {
		steps[i] = fmt.Sprintf("%-*s", width, s)
	}
	return steps
}

// webhookReceiver serves the Argo Events stand-in, and reports the requests
// tether delivered from its webhook buffer: those with X-Tether-Delivery.
type webhookReceiver struct {
	URL        string        // http://127.0.0.1:port
	deliveries chan delivery // a delivery nobody waits for is dropped
	srv        *http.Server
	served     chan struct{} // closed when srv stopped serving
}

// delivery is what the receiver saw of one.
type delivery struct {
	id, attempt string
	signed      bool // X-Hub-Signature-256 matches the body that arrived
}

// maxDemoWebhook bounds what the receiver reads of a delivery's body to
// check its signature.
const maxDemoWebhook = 1 << 20

func startWebhookReceiver() (*webhookReceiver, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for the %s stand-in: %w", standin.ArgoEvents, err)
	}
	wr := &webhookReceiver{URL: "http://" + ln.Addr().String(), deliveries: make(chan delivery, 8), served: make(chan struct{})}
	wr.srv = &http.Server{Handler: wr.record(standin.Handler(standin.ArgoEvents)), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(wr.served)
		_ = wr.srv.Serve(ln) // http.ErrServerClosed once Close shuts it down
	}()
	return wr, nil
}

// record reports each delivery, then lets next answer it.
func (wr *webhookReceiver) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(webhook.DeliveryHeader)
		if id == "" {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDemoWebhook))
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case wr.deliveries <- delivery{
			id: id, attempt: r.Header.Get(webhook.AttemptHeader),
			signed: hmac.Equal([]byte(r.Header.Get("X-Hub-Signature-256")), []byte(webhookSignature(body))),
		}:
		default:
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// wait returns the delivery of id, or an error once timeout passed.
func (wr *webhookReceiver) wait(ctx context.Context, id string, timeout time.Duration) (delivery, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		select {
		case d := <-wr.deliveries:
			if d.id == id {
				return d, nil
			}
		case <-ctx.Done():
			return delivery{}, fmt.Errorf("the %s stand-in did not receive webhook %s: %w", standin.ArgoEvents, id, ctx.Err())
		}
	}
}

// Close stops the receiver and waits for it.
func (wr *webhookReceiver) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = wr.srv.Shutdown(ctx)
	<-wr.served
}
