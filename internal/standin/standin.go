// Package standin serves small stand-ins for the in-cluster services a tether
// client routes to: the platform's app-proxy and the Argo components. `tether
// demo` runs them on loopback so that a request can make the whole trip
// without a cluster; each shows one kind of traffic the tunnel must carry:
// plain JSON, server-sent events, websockets and webhook posts.
//
// They are demonstrations, not fakes of the real APIs: paths and payloads
// are made up and stable only for the demo.
package standin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/websocket"
)

// Names of the stand-ins, equal to the proxy adapters they stand in for.
const (
	AppProxy      = "app-proxy"
	ArgoCD        = "argo-cd"
	ArgoWorkflows = "argo-workflows"
	ArgoEvents    = "argo-events"
	ArgoRollouts  = "argo-rollouts"
)

// Handler returns the stand-in for an adapter name, or nil.
func Handler(name string) http.Handler {
	switch name {
	case AppProxy:
		return appProxy()
	case ArgoCD:
		return argoCD()
	case ArgoWorkflows:
		return workflows()
	case ArgoEvents:
		return events()
	case ArgoRollouts:
		return rollouts()
	}
	return nil
}

// Names lists the stand-ins in the order of the default adapters.
func Names() []string {
	return []string{AppProxy, ArgoCD, ArgoWorkflows, ArgoEvents, ArgoRollouts}
}

// echo answers with what arrived: the component, method, path and the
// forwarding headers the tunnel set.
func echo(component string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{
			"component":         component,
			"method":            r.Method,
			"path":              r.URL.Path,
			"query":             r.URL.RawQuery,
			"host":              r.Host,
			"x_forwarded_for":   r.Header.Get("X-Forwarded-For"),
			"x_forwarded_host":  r.Header.Get("X-Forwarded-Host"),
			"x_forwarded_proto": r.Header.Get("X-Forwarded-Proto"),
		})
	}
}

func ok(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }

// appProxy: /healthz, /ws/echo (websocket echo), anything else echoed.
func appProxy() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", ok)
	mux.Handle("/ws/echo", websocket.Server{
		Handshake: func(*websocket.Config, *http.Request) error { return nil }, // any Origin: curl sends none
		Handler:   func(ws *websocket.Conn) { _, _ = io.Copy(ws, ws) },
	})
	mux.HandleFunc("/", echo(AppProxy))
	return mux
}

// argoCD serves under its root path /argo-cd, like argocd-server --rootpath.
func argoCD() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/argo-cd/api/version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]string{"Version": "v0.0.0-standin"})
	})
	mux.HandleFunc("/argo-cd/", echo(ArgoCD))
	return mux
}

// workflows streams server-sent events at /api/v1/workflow-events/{ns}: one
// event a second, five in all.
func workflows() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/workflow-events/{namespace}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		rc := http.NewResponseController(w)
		for i := 1; i <= 5; i++ {
			ev := map[string]any{"type": "MODIFIED", "namespace": r.PathValue("namespace"), "workflow": "hello-world", "seq": i}
			b, _ := json.Marshal(ev)
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			if i == 5 {
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Second):
			}
		}
	})
	mux.HandleFunc("/", echo(ArgoWorkflows))
	return mux
}

// events receives webhooks: /health, and POST to any path is acknowledged
// with the size and the event type of the delivery.
func events() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", ok)
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		event := r.Header.Get("X-GitHub-Event")
		if event == "" {
			event = r.Header.Get("X-Gitlab-Event")
		}
		writeJSON(w, map[string]any{"component": ArgoEvents, "endpoint": r.URL.Path, "received_bytes": n, "event": event})
	})
	mux.HandleFunc("GET /", echo(ArgoEvents))
	return mux
}

// rollouts serves the dashboard under its default root path /rollouts.
func rollouts() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/rollouts/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><title>Argo Rollouts (stand-in)</title><h1>Argo Rollouts dashboard stand-in</h1>\n")
	})
	mux.HandleFunc("/", echo(ArgoRollouts))
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Set is a group of running stand-ins.
type Set struct {
	URLs    map[string]string // name -> http://127.0.0.1:port
	servers []*http.Server
	done    chan struct{} // one value per stand-in that stopped serving
}

// Start runs every stand-in on its own loopback port.
func Start() (*Set, error) {
	s := &Set{URLs: make(map[string]string), done: make(chan struct{}, len(Names()))}
	for _, name := range Names() {
		var lc net.ListenConfig
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("listen for the %s stand-in: %w", name, err)
		}
		srv := &http.Server{Handler: Handler(name), ReadHeaderTimeout: 10 * time.Second}
		s.servers = append(s.servers, srv)
		s.URLs[name] = "http://" + ln.Addr().String()
		go func() {
			_ = srv.Serve(ln) // http.ErrServerClosed once Close shuts it down
			s.done <- struct{}{}
		}()
	}
	return s, nil
}

// Close stops the stand-ins and waits for them.
func (s *Set) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, srv := range s.servers {
		_ = srv.Shutdown(ctx)
	}
	for range s.servers {
		<-s.done
	}
}
