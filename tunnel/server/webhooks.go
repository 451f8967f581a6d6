package server

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/tether-dev/tether/proxy"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/server/buffer"
	"github.com/tether-dev/tether/tunnel/server/registry"
	"github.com/tether-dev/tether/tunnel/server/webhook"
)

// webhooks is the server's store and forward of buffered routes (package
// webhook, whose doc says how it is wired): the routes each tunnel's last
// login advertised, and the Forwarder that stores the requests of those
// routes that cannot reach their tunnel and delivers them when it is back.
// Both are kept where the revocations are (Server.backing). With that in
// memory buffering is off: fw and routes are nil, and every method does
// nothing.
type webhooks struct {
	routes *registry.Routes
	fw     *webhook.Forwarder
	off    error // why buffering is off; nil when on
	sender *webhookSender
	log    *zap.Logger
}

// openWebhooks opens the remembered routes and the Forwarder where backing
// says; buffer.ErrDisabled is no error: buffering is off.
func openWebhooks(cfg Config, backing registry.Backing, log *zap.Logger) (*webhooks, error) {
	wh := &webhooks{sender: &webhookSender{}, log: log}
	routes, err := registry.NewRoutes(registry.RoutesConfig{Retention: cfg.BufferRetention}, backing, log)
	if err != nil {
		return nil, err
	}
	fw, err := webhook.New(webhook.Config{
		Buffer: buffer.Config{
			Retention:     cfg.BufferRetention,
			MaxRequests:   cfg.BufferMaxRequests,
			MaxBytes:      cfg.BufferMaxBytes,
			MaxTotalBytes: cfg.BufferMaxTotalBytes,
		},
		MaxBody:         cfg.BufferMaxBody,
		BodyIdleTimeout: cfg.BodyIdleTimeout,
	}, backing, routes, wh.sender, log)
	switch {
	case errors.Is(err, buffer.ErrDisabled):
		_ = routes.Close()
		wh.off = err
		return wh, nil
	case err != nil:
		_ = routes.Close()
		return nil, err
	}
	wh.routes, wh.fw = routes, fw
	return wh, nil
}

// bind gives the Forwarder what serving made: the sessions it delivers
// through, the members' logins, and the metrics registry.
func (wh *webhooks) bind(sv *replica) {
	wh.sender.sv = sv
	sv.members.webhooks = wh
	if wh.fw != nil {
		sv.metrics.reg.MustRegister(wh.fw.Collector())
	}
}

// register mounts the buffer's admin endpoints behind wrap (the admin
// token); none when buffering is off.
func (wh *webhooks) register(mux *http.ServeMux, wrap func(http.Handler) http.Handler) {
	if wh.fw != nil {
		wh.fw.Register(mux, wrap)
	}
}

// run starts the deliveries and the routes' writer under g, or says once
// that buffering is off. stop, called once the public entry no longer takes
// requests, ends the deliveries (they give their leases back), then the
// routes' writer (which writes what is pending); close releases the rest.
func (wh *webhooks) run(ctx context.Context, g *errgroup.Group) (stop func()) {
	if wh.fw == nil {
		wh.log.Info(wh.off.Error())
		return func() {}
	}
	fwCtx, stopFw := context.WithCancel(context.WithoutCancel(ctx))
	routesCtx, stopRoutes := context.WithCancel(context.WithoutCancel(ctx))
	delivered := make(chan struct{})
	g.Go(func() error {
		defer close(delivered)
		return wh.fw.Run(fwCtx)
	})
	g.Go(func() error { return wh.routes.Run(routesCtx) })
	return func() {
		stopFw()
		<-delivered
		_ = wh.fw.Close()
		stopRoutes()
	}
}

// close releases the Forwarder and the routes; call it after run's
// goroutines ended, before the data directory's store closes.
func (wh *webhooks) close() {
	if wh.fw != nil {
		_ = wh.fw.Close()
		_ = wh.routes.Close()
	}
}

// loggedIn remembers the routes a login of tunnel advertised (none for a
// stock frpc): what decides, while the tunnel is down, whether a request
// for it is buffered.
func (wh *webhooks) loggedIn(tunnel string, routes []proxy.Route) {
	if wh == nil || wh.routes == nil {
		return
	}
	specs := make([]string, len(routes))
	for i, r := range routes {
		specs[i] = r.String()
	}
	if err := wh.routes.Remember(tunnel, specs); err != nil {
		wh.log.Warn("could not remember the tunnel's routes: its webhooks are not buffered while it is down", zap.String("tunnel", tunnel), zap.Error(err))
	}
}

// serving starts delivering tunnel's queue: a session serves it here now.
func (wh *webhooks) serving(tunnel string) {
	if wh != nil {
		wh.fw.Kick(tunnel)
	}
}

// left records that the tunnel's last session here ended.
func (wh *webhooks) left(tunnel string) {
	if wh != nil && wh.routes != nil {
		wh.routes.Left(tunnel)
	}
}

// offer stores r, a public request for tunnel that no session took any of,
// if its route buffers it, and reports whether it answered r (Offer).
func (wh *webhooks) offer(w http.ResponseWriter, r *http.Request, tunnel string) bool {
	return wh.fw.Offer(w, r, tunnel)
}

// offerKey is the context key of an offerable request (markOfferable).
type offerKey struct{}

// offerable is what the router's Unreachable hook needs to offer a
// request: the Forwarder, and the tunnel the request is for.
type offerable struct {
	fw     *webhook.Forwarder
	tunnel string
}

// markOfferable returns r, a caller's request for tunnel (from the public
// entry, or forwarded by another replica), marked so that a session's
// router hands it to the Forwarder when the tunnel's client cannot connect
// to its upstream (offerUnreachable). A delivery from the buffer is never
// marked: it must not be stored again. Only a request whose method may be
// buffered is marked: the others cost nothing.
func (wh *webhooks) markOfferable(r *http.Request, tunnel string) *http.Request {
	if wh.fw == nil {
		return r
	}
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		return r.WithContext(context.WithValue(r.Context(), offerKey{}, &offerable{fw: wh.fw, tunnel: tunnel}))
	}
	return r
}

// offerUnreachable is a router's proxy.Options.Unreachable: a request the
// entry marked (markOfferable), none of whose body was read, is offered to
// the Forwarder. Within the entry's route, so within the request's slot.
func offerUnreachable(w http.ResponseWriter, r *http.Request) bool {
	o, _ := r.Context().Value(offerKey{}).(*offerable)
	if o == nil {
		return false
	}
	if body, ok := r.Body.(*guardedBody); ok && body.started() {
		return false
	}
	return o.fw.Offer(w, r, o.tunnel)
}

// summaryTimeout bounds the store's work for the buffers of /api/tunnels.
const summaryTimeout = 3 * time.Second

// withBuffers gives each row of list (sessions, sorted by tunnel) its
// tunnel's buffer, and adds a row for each tunnel that has stored requests
// but no session here. A store that fails leaves the buffers out.
func (wh *webhooks) withBuffers(ctx context.Context, list []Info) []Info {
	if wh.fw == nil {
		return list
	}
	ctx, cancel := context.WithTimeout(ctx, summaryTimeout)
	defer cancel()
	sums, err := wh.fw.Summaries(ctx)
	if err != nil {
		wh.log.Warn("/api/tunnels lists no buffered requests: the buffer's store failed", zap.Error(err))
		return list
	}
	listed := make(map[string]bool, len(list))
	for i := range list {
		if s, ok := sums[list[i].Name]; ok {
			list[i].Buffer = &s
		}
		listed[list[i].Name] = true
	}
	for name, s := range sums {
		if !listed[name] {
			list = append(list, Info{Name: name, Buffer: &s})
		}
	}
	slices.SortStableFunc(list, func(a, b Info) int { return cmp.Compare(a.Name, b.Name) })
	return list
}

// probeTimeout bounds the store's work for a login probe's reply.
const probeTimeout = 2 * time.Second

// describe tells a login probe's reply (tether diagnose) about the
// tunnel's buffered requests: one store round trip, for a caller that
// holds the tunnel's token. A store that fails leaves them out.
func (wh *webhooks) describe(reply *tunnel.ProbeReply) {
	if wh.fw == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	sum, err := wh.fw.Summary(ctx, reply.Tunnel)
	if err != nil {
		wh.log.Debug("a login probe's reply says nothing of the buffer: its store failed", zap.String("tunnel", reply.Tunnel), zap.Error(err))
		return
	}
	reply.Buffered, reply.BufferRejected = sum.Queued, sum.Rejected
	if !sum.Oldest.IsZero() {
		reply.BufferedSince = &sum.Oldest
	}
}

// webhookSender carries deliveries through this replica's sessions
// (webhook.Sender): the entry's way to a session, minus the public part.
// bind sets sv before anything delivers.
type webhookSender struct{ sv *replica }

// Serves reports whether a session here serves tunnel (not one a drain
// retired).
func (s *webhookSender) Serves(tunnel string) bool { return s.sv.members.serves(tunnel) }

// Send serves req through a session here, as the entry would, trying the
// tunnel's other sessions while one fails before any of req reached it;
// the answer's body is discarded.
func (s *webhookSender) Send(ctx context.Context, tunnel string, req *http.Request) (webhook.Answer, error) {
	sv := s.sv
	req.Host = tunnel + "." + sv.srv.cfg.Domain
	body := guardBody(req)
	var tried []*member
	for {
		m := sv.members.pick(tunnel, false, tried)
		if m == nil {
			return webhook.Answer{}, webhook.ErrNotServed
		}
		answer := discardAnswer{header: http.Header{}}
		w := proxy.NewStatusWriter(answer)
		if !sv.serveBy(m, w, req, body) {
			tried = append(tried, m)
			continue
		}
		if err := ctx.Err(); err != nil {
			return webhook.Answer{}, err
		}
		return webhook.Answer{Status: w.Status(), Code: answer.header.Get(proxy.ErrorHeader)}, nil
	}
}

// discardAnswer takes a delivery's answer: its head is read, its body
// dropped.
type discardAnswer struct{ header http.Header }

func (a discardAnswer) Header() http.Header       { return a.header }
func (discardAnswer) Write(p []byte) (int, error) { return len(p), nil }
func (discardAnswer) WriteHeader(int)             {}
