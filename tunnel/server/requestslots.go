package server

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/tether-dev/tether/internal/source"
	"github.com/tether-dev/tether/proxy"
)

// A tunnel's request slots on this replica: what its callers, who need no
// token, can make the replica hold for it. Every request in flight for the
// tunnel, served here or forwarded, holds a goroutine, a stream and its
// buffers; MaxRequestsPerTunnel bounds them so that one tunnel's flood
// cannot take the replica's memory, and the shares below keep one caller,
// or one kind of request, from taking the tunnel's slots from the others.
//
//   - A caller (its address, an IPv6 /64; behind --trusted-proxies the
//     client address they give) holds at most MaxRequestsPerCaller of a
//     tunnel's slots: one caller that keeps requests open (bodies sent a
//     byte at a time, long polls, downloads it does not read) no longer
//     keeps everyone else out. It takes four callers at the default.
//   - Long-lived requests (websocket upgrades and event streams, which a
//     request says it is: an Upgrade, or Accept: text/event-stream) hold
//     at most half of the tunnel's slots, and a caller at most
//     MaxRequestsPerCaller of them besides its ordinary ones: streams that
//     stay open for hours cannot starve the tunnel's ordinary requests,
//     which always have half its slots. A request that does not say it is
//     long-lived (a long poll, a slow download) counts as ordinary, within
//     its caller's share.
//
// The total stays MaxRequestsPerTunnel, so the memory a tunnel's requests
// can hold is what it was.
type requestSlots struct {
	// Static after construction.
	perTunnel, longPerTunnel, perCaller int

	// Guarded by mu.
	mu      sync.Mutex
	tunnels map[string]tunnelLoad // no entry for none
	callers map[requestSlot]int   // requests of a caller, by kind; no entry for none
}

// tunnelLoad is a tunnel's requests in flight.
type tunnelLoad struct {
	all, long int
}

// requestSlot is the place a request takes: its tunnel, its caller, and
// whether it is long-lived. Zero is none.
type requestSlot struct {
	tunnel string
	caller netip.Addr
	long   bool
}

// callerShareDivisor: a caller may hold a quarter of a tunnel's slots by
// default (256 of 1024). A tunnel's main caller is the platform, often
// from one egress address; a quarter of the slots is far more than a
// runtime's platform traffic has in flight at once, and it takes four
// callers, not one, to fill a tunnel.
const callerShareDivisor = 4

// Why a request got no slot.
type slotRefusal int

const (
	slotGranted slotRefusal = iota
	slotTunnelFull
	slotLongFull   // the tunnel's long-lived half is taken
	slotCallerFull // the caller's share is taken
)

func newRequestSlots(perTunnel, perCaller int) *requestSlots {
	return &requestSlots{
		perTunnel: perTunnel, longPerTunnel: max(perTunnel/2, 1), perCaller: perCaller,
		tunnels: make(map[string]tunnelLoad), callers: make(map[requestSlot]int),
	}
}

// acquire takes slot unless a bound says no.
func (l *requestSlots) acquire(slot requestSlot) slotRefusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.tunnels[slot.tunnel]
	switch {
	case t.all >= l.perTunnel:
		return slotTunnelFull
	case slot.long && t.long >= l.longPerTunnel:
		return slotLongFull
	case l.callers[slot] >= l.perCaller:
		return slotCallerFull
	}
	t.all++
	if slot.long {
		t.long++
	}
	l.tunnels[slot.tunnel] = t
	l.callers[slot]++
	return slotGranted
}

// release gives back a slot acquire granted.
func (l *requestSlots) release(slot requestSlot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.tunnels[slot.tunnel]
	t.all--
	if slot.long {
		t.long--
	}
	if t.all <= 0 {
		delete(l.tunnels, slot.tunnel)
	} else {
		l.tunnels[slot.tunnel] = t
	}
	if n := l.callers[slot]; n <= 1 {
		delete(l.callers, slot)
	} else {
		l.callers[slot] = n - 1
	}
}

// takeSlot takes a slot for r, a request for tunnel name, or answers it
// (503 tunnel_busy, 429 caller_busy) and reports false.
func (s *replica) takeSlot(w http.ResponseWriter, r *http.Request, name string) (requestSlot, bool) {
	slot := requestSlot{tunnel: name, caller: s.srv.callerOf(r), long: longLived(r)}
	refusal := s.inflight.acquire(slot)
	if refusal == slotGranted {
		return slot, true
	}
	if r.ContentLength != 0 {
		// Go's server would otherwise read up to 256 KiB of the unread
		// body before it answers, at the caller's pace: a caller that
		// trickles its body would get no answer, and hold a goroutine.
		w.Header().Set("Connection", "close")
	}
	switch refusal {
	case slotCallerFull:
		s.answerCallerBusy(w, r, slot)
	case slotLongFull:
		s.answerBusy(w, r, slot.tunnel, s.inflight.longPerTunnel, "websocket and event-stream requests")
	default:
		s.answerBusy(w, r, slot.tunnel, s.srv.cfg.MaxRequestsPerTunnel, "requests")
	}
	return requestSlot{}, false
}

// callerOf is who sent r, for its share of the tunnel's slots: the
// rightmost address of X-Forwarded-For that is not one of
// --trusted-proxies. The entry has set the header by then (setForwarded),
// ending it with the address the request came from, and a replica passes
// it on unchanged, so every replica finds the same caller. An address
// that does not parse ends the search: whoever wrote it is not to be
// believed further left, and the last address read is the caller.
func (s *Server) callerOf(r *http.Request) netip.Addr {
	var caller netip.Addr
	values := r.Header["X-Forwarded-For"]
	for i := len(values) - 1; i >= 0; i-- {
		list := values[i]
		for list != "" {
			var item string
			if j := strings.LastIndexByte(list, ','); j >= 0 {
				list, item = list[:j], list[j+1:]
			} else {
				list, item = "", list
			}
			addr, err := netip.ParseAddr(strings.TrimSpace(item))
			if err != nil {
				return source.Key(caller)
			}
			caller = addr.Unmap()
			if !s.trustsAddr(caller) {
				return source.Key(caller)
			}
		}
	}
	if !caller.IsValid() {
		caller = addrOfString(r.RemoteAddr)
	}
	return source.Key(caller)
}

// addrOfString is the address of a HOST:PORT, or the zero Addr.
func addrOfString(hostport string) netip.Addr {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// longLived reports whether r says it will stay open: a protocol upgrade
// (websocket), or a request for an event stream.
func longLived(r *http.Request) bool {
	h := r.Header
	if len(h["Upgrade"]) > 0 && headerHasToken(h["Connection"], "upgrade") {
		return true
	}
	for _, v := range h["Accept"] {
		if containsFold(v, "text/event-stream") {
			return true
		}
	}
	return false
}

// headerHasToken reports whether one of values' comma-separated tokens is
// token (lower case), ignoring case.
func headerHasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// containsFold reports whether s contains sub (lower case), ignoring case,
// without allocating: it runs for every request.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// answerBusy answers a request beyond its tunnel's MaxRequestsPerTunnel
// (limit), or beyond the half of them long-lived requests may hold; what
// names the requests counted.
func (s *replica) answerBusy(w http.ResponseWriter, r *http.Request, name string, limit int, what string) {
	s.metrics.unrouted.WithLabelValues("tunnel_busy").Inc()
	s.srv.floodLog.Warn("request refused: the tunnel has too many requests in flight",
		zap.String("tunnel", name), zap.Int("limit", limit), zap.String("counted", what),
		zap.String("method", r.Method), zap.String("path", r.URL.Path))
	w.Header().Set("Retry-After", "1")
	proxy.WriteError(w, http.StatusServiceUnavailable, "tunnel_busy", fmt.Sprintf(
		"tether: tunnel %q has %d %s in flight on this server, its limit (--max-requests-per-tunnel, half of it for websockets and event streams); retry later",
		name, limit, what))
}

// answerCallerBusy answers a request beyond its caller's share of the
// tunnel's slots.
func (s *replica) answerCallerBusy(w http.ResponseWriter, r *http.Request, slot requestSlot) {
	s.metrics.unrouted.WithLabelValues(unroutedCallerBusy).Inc()
	what := "requests"
	if slot.long {
		what = "websocket and event-stream requests"
	}
	s.srv.floodLog.Warn("request refused: the caller has too many requests in flight to the tunnel",
		zap.String("tunnel", slot.tunnel), zap.String("caller", slot.caller.String()), zap.Int("limit", s.srv.cfg.MaxRequestsPerCaller),
		zap.Bool("long_lived", slot.long), zap.String("method", r.Method), zap.String("path", r.URL.Path))
	w.Header().Set("Retry-After", "1")
	proxy.WriteError(w, http.StatusTooManyRequests, unroutedCallerBusy, fmt.Sprintf(
		"tether: you have %d %s in flight to tunnel %q on this server, a caller's share (--max-requests-per-caller); retry when some have finished",
		s.srv.cfg.MaxRequestsPerCaller, what, slot.tunnel))
}

// unroutedCallerBusy is the code and metric reason of a request beyond its
// caller's share.
const unroutedCallerBusy = "caller_busy"
