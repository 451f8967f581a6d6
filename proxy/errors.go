package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"

	"go.uber.org/zap"
)

// ErrorHeader is the response header that carries a machine-readable code
// when the router itself answers a request instead of the upstream. Its
// values are the Code constants; a response without it came from the
// upstream.
const ErrorHeader = "X-Tether-Error"

// Values of ErrorHeader. The body of such a response is one short line of
// text for a person, starting with "tether: ".
const (
	// CodeNoRoute (404): no route's prefix matches the path.
	CodeNoRoute = "no_route"
	// CodeBadRequest (400): the request target is not an absolute path, or
	// has "." or ".." segments.
	CodeBadRequest = "bad_request"
	// CodeMethodNotAllowed (405): CONNECT; the router is not a forward proxy.
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeUpstreamUnreachable (502): connecting to the upstream failed
	// (refused, unknown host, no answer within the dial timeout).
	CodeUpstreamUnreachable = "upstream_unreachable"
	// CodeUpstreamTLS (502): the TLS handshake with an https upstream failed,
	// most often because its certificate is not trusted.
	CodeUpstreamTLS = "upstream_tls"
	// CodeUpstreamTimeout (504): the upstream sent no response headers within
	// the route's timeout.
	CodeUpstreamTimeout = "upstream_timeout"
	// CodeUpstreamFailed (502): the upstream closed the connection before a
	// response, or the connection failed.
	CodeUpstreamFailed = "upstream_failed"
	// CodeUpstreamBadResponse (502): the upstream's answer is not one tether
	// passes on (ErrBadResponse): response heads beyond MaxHeadBytes or
	// MaxHeadFields, a protocol switch the request did not ask for, or
	// bytes that are not an HTTP/1.1 response. The connection is closed.
	CodeUpstreamBadResponse = "upstream_bad_response"
	// CodeCanceled (502, rarely seen): the caller went away first.
	CodeCanceled = "canceled"
)

// ResponseError is an error that knows how the router should answer it:
// a dialer that reaches upstreams through something else (a tunnel) returns
// one when that something fails, so the caller learns what really broke.
type ResponseError interface {
	error
	// Response returns the HTTP status, the X-Tether-Error code and a short
	// message for the caller.
	Response() (status int, code, msg string)
}

// failure is how the router answers a failed upstream request.
type failure struct {
	status int
	code   string
	msg    string // for the caller, without the trailing newline
}

// classify turns a transport error into the answer for the caller. It never
// puts the raw error in the answer, nor the upstream's address: the caller
// learns which route failed and how; the log has the rest.
func (rt *route) classify(err error) failure {
	up := "the upstream of route " + rt.Prefix + " (" + rt.Adapter + ")"
	var re ResponseError
	if errors.As(err, &re) {
		status, code, msg := re.Response()
		return failure{status, code, msg}
	}
	if errors.Is(err, errHeaderTimeout) {
		return failure{http.StatusGatewayTimeout, CodeUpstreamTimeout, fmt.Sprintf(
			"tether: %s sent no response headers within %s, the route's timeout", up, rt.Timeout)}
	}
	if errors.Is(err, ErrBadResponse) {
		return failure{http.StatusBadGateway, CodeUpstreamBadResponse, BadResponseMessage(up, err)}
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return failure{http.StatusBadGateway, CodeUpstreamUnreachable, fmt.Sprintf(
			"tether: %s is unreachable: %s", up, rt.dialReason(err))}
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return failure{http.StatusBadGateway, CodeUpstreamTLS, fmt.Sprintf(
			"tether: %s failed TLS verification; set insecure-skip-verify on the route if it uses a self-signed certificate", up)}
	}
	var recErr tls.RecordHeaderError
	if errors.As(err, &recErr) {
		return failure{http.StatusBadGateway, CodeUpstreamTLS, fmt.Sprintf(
			"tether: %s does not speak TLS; use an http:// upstream URL", up)}
	}
	var alert tls.AlertError
	if errors.As(err, &alert) {
		return failure{http.StatusBadGateway, CodeUpstreamTLS, fmt.Sprintf(
			"tether: %s refused the TLS handshake: %v", up, alert)}
	}
	reason := "the request could not be completed"
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		reason = "it closed the connection before responding"
	case errors.As(err, &te) && te.Timeout():
		reason = "it timed out"
	}
	return failure{http.StatusBadGateway, CodeUpstreamFailed, fmt.Sprintf("tether: %s failed: %s", up, reason)}
}

// dialReason says why a dial failed, in words an operator can act on and
// without the upstream's name: the log has it.
func (rt *route) dialReason(err error) string {
	var dnsErr *net.DNSError
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return "its host name is not found"
	case errors.As(err, &dnsErr):
		return "the DNS lookup of its host name failed"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to host"
	case errors.As(err, &te) && te.Timeout():
		return fmt.Sprintf("no answer within %s", rt.dialTimeout)
	default:
		return "cannot connect"
	}
}

// handleError answers a request that could not be forwarded. req is the
// outbound request (or the caller's), whose context is the caller's.
func (rt *route) handleError(w http.ResponseWriter, req *http.Request, err error) {
	if req.Context().Err() != nil {
		// The caller went away (the tunnel stream closed): nothing to answer,
		// nothing for an operator to do.
		if sw, ok := w.(*StatusWriter); ok {
			sw.canceled = true
		}
		rt.log.Debug("request canceled by caller", zap.Error(err))
		w.Header().Set(ErrorHeader, CodeCanceled)
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	f := rt.classify(err)
	rt.log.Warn("upstream request failed",
		zap.String("code", f.code),
		zap.Int("status", f.status),
		zap.Error(err))
	WriteError(w, f.status, f.code, f.msg)
}

// tookUnreachable hands in, a request whose upstream could not be
// connected to (err), to Options.Unreachable, and reports whether that
// answered it. A request that carried a body never reaches a second dial
// (exchange.retryable), so none of it was sent.
func (rt *route) tookUnreachable(w http.ResponseWriter, in *http.Request, err error) bool {
	if rt.unreachable == nil || in.Context().Err() != nil || rt.classify(err).code != CodeUpstreamUnreachable {
		return false
	}
	return rt.unreachable(w, in)
}

// WriteError answers with tether's own short plain-text error: msg (which
// starts with "tether: ") and the machine-readable X-Tether-Error code, so a
// person and a script can both tell tether's answer from an upstream's.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set(ErrorHeader, code)
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n") //nolint:gosec // text/plain with nosniff: never rendered as HTML
}
