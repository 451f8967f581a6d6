package server

import (
	"net"

	"github.com/tether-dev/tether/tunnel/server/gate"
)

// HandOver gives frp a stream the gate admitted (gate.Host).
func (s *replica) HandOver(_ *gate.Session, conn net.Conn) bool { return s.frp.conns.Push(conn) }

// WorkConn puts the guard on a stock frpc's work connection (gate.Host):
// see workguard.go.
func (s *replica) WorkConn(stream gate.Stream, v2 bool) net.Conn { return s.frp.guardWork(stream, v2) }

// Silent is the membership's to judge (gate.Host).
func (s *replica) Silent(sess *gate.Session) { s.members.Silent(sess) }

// Ended is the membership's to record (gate.Host).
func (s *replica) Ended(sess *gate.Session) { s.members.Ended(sess) }
