package server

import (
	"slices"
	"strings"
	"sync"
)

// Registry answers which tunnels this server holds and where tunnel N is.
// The in-memory registry is the default for a single server; a shared
// registry (one entry per tunnel with the replica that holds it) can take its
// place when several replicas serve one domain.
//
// Implementations are safe for concurrent use and never block on I/O of the
// sessions they hold.
type Registry interface {
	// Claim makes sess the session serving its tunnel and returns the session
	// it replaces, if any. The caller closes the replaced session.
	Claim(sess *Session) (replaced *Session)
	// Release removes sess if it still serves its tunnel.
	Release(sess *Session)
	// Lookup returns the session serving tunnel name.
	Lookup(name string) (*Session, bool)
	// List returns the sessions of every tunnel held here, sorted by name.
	List() []*Session
}

// NewMemoryRegistry returns the single-process registry.
func NewMemoryRegistry() Registry {
	return &memoryRegistry{byName: make(map[string]*Session)}
}

type memoryRegistry struct {
	mu     sync.RWMutex
	byName map[string]*Session
}

func (r *memoryRegistry) Claim(sess *Session) *Session {
	name := sess.Tunnel()
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.byName[name]
	r.byName[name] = sess
	if old == sess {
		return nil
	}
	return old
}

func (r *memoryRegistry) Release(sess *Session) {
	name := sess.Tunnel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byName[name] == sess {
		delete(r.byName, name)
	}
}

func (r *memoryRegistry) Lookup(name string) (*Session, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.byName[name]
	return s, ok
}

func (r *memoryRegistry) List() []*Session {
	r.mu.RLock()
	list := make([]*Session, 0, len(r.byName))
	for _, s := range r.byName {
		list = append(list, s)
	}
	r.mu.RUnlock()
	slices.SortFunc(list, func(a, b *Session) int { return strings.Compare(a.Tunnel(), b.Tunnel()) })
	return list
}
