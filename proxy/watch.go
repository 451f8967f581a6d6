package proxy

import (
	"errors"
	"net"
	"time"
)

// A pooled connection is watched while it is idle: anything that arrives
// then (an extra response, a body after a HEAD answer, junk) or its end
// takes it out of the pool and closes it at once, as http.Transport closes
// a connection that receives an unsolicited response. Otherwise the next
// request would read those bytes as its answer, and a tunnel stream nobody
// reads would hold what the upstream sends, up to its window (megabytes),
// until it is next used or reaped; closed, a stream is reset and holds
// nothing.
//
// A goroutine watches each idle connection. On a tunnel stream, a
// ReadyWaiter, it waits without reading (a waiting watch), so a request
// takes the connection without stopping it: the watch leaves when its wait
// ends on the request's own answer, or stays to watch the connection's
// next idle period, and the request path pays nothing but an atomic
// operation. On another connection it must read a byte (a reading watch),
// and a request stops it with a read deadline first.

// States of a waiting watch.
const (
	watchNone     int32 = iota // no goroutine
	watchArmed                 // the connection is idle, watched
	watchDisarmed              // a request has the connection; the goroutine leaves at its next wake
)

// watch starts watching pc, just put in the pool; t.mu is held, so no
// request takes it before.
func (pc *persistConn) watch() {
	if pc.rawWaiter == nil {
		pc.stopping.Store(false)
		go pc.watchByReading()
		return
	}
	pc.epoch.Add(1)
	// A goroutine still waiting from an earlier idle period watches on.
	if !pc.watchState.CompareAndSwap(watchDisarmed, watchArmed) {
		pc.watchState.Store(watchArmed)
		go pc.watchWaiting()
	}
}

// watchWaiting is a waiting watch's goroutine.
func (pc *persistConn) watchWaiting() {
	for {
		epoch := pc.epoch.Load()
		pc.rawWaiter.WaitReady()
		switch {
		case pc.watchState.CompareAndSwap(watchDisarmed, watchNone):
			return // the bytes are a request's answer
		case pc.epoch.Load() != epoch:
			// A request had the connection and gave it back meanwhile: the
			// wait may have ended on its answer. Look again.
		case pc.watchState.CompareAndSwap(watchArmed, watchNone):
			// Bytes, or the end, while idle.
			if pc.t.drop(pc) {
				pc.close()
			}
			return
		}
	}
}

// watchByReading is a reading watch's goroutine.
func (pc *persistConn) watchByReading() {
	pc.peekN, pc.peekErr = pc.raw.Read(pc.peek[:])
	if !pc.stopping.Load() && pc.t.drop(pc) {
		pc.close()
	}
	pc.watched <- struct{}{}
}

// aLongTimeAgo is a read deadline in the past: the read returns at once.
var aLongTimeAgo = time.Unix(1, 0)

// unwatch takes the watch off a connection taken from the pool and reports
// whether the connection may carry a request: nothing arrived while it was
// idle, and it is still open. Bytes that arrive as a request takes the
// connection are that request's answer, as with http.Transport.
func (pc *persistConn) unwatch() bool {
	if pc.rawWaiter != nil {
		return pc.watchState.CompareAndSwap(watchArmed, watchDisarmed)
	}
	// A reading watch reads raw, so that a TLS connection's state is not
	// touched: any byte read means the connection is unusable anyway.
	pc.stopping.Store(true)
	if pc.raw.SetReadDeadline(aLongTimeAgo) != nil {
		pc.close()
		<-pc.watched
		return false
	}
	<-pc.watched
	var ne net.Error
	if pc.peekN > 0 || !errors.As(pc.peekErr, &ne) || !ne.Timeout() {
		return false
	}
	return pc.raw.SetReadDeadline(time.Time{}) == nil
}
