package gossiptest

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrPartitioned is the error of a dial to a transport cut off by a split.
var ErrPartitioned = errors.New("gossiptest: partitioned")

// Network is a set of Transports on 127.0.0.1, each in a group, and the
// current split between the groups. Its methods are safe for concurrent use.
type Network struct {
	logger *log.Logger

	mu     sync.RWMutex
	groups map[netip.AddrPort]string // bound address of each open transport -> its group
	open   map[*Transport]struct{}
	split  map[string]bool // the groups cut off from each other; empty when healed

	droppedPackets atomic.Int64
	refusedDials   atomic.Int64
}

// NewNetwork returns a Network without transports, healed. logger receives
// the log lines of the underlying memberlist.NetTransports; nil discards
// them.
func NewNetwork(logger *log.Logger) *Network {
	if logger == nil {
		logger = log.New(io.Discard, "", 0)
	}
	return &Network{
		logger: logger,
		groups: map[netip.AddrPort]string{},
		open:   map[*Transport]struct{}{},
		split:  map[string]bool{},
	}
}

// Transport starts a transport in group: a memberlist.NetTransport listening
// on a free port of 127.0.0.1 (UDP and TCP), behind the Network's split. The
// node it is given to shuts it down; so does Network.Shutdown.
func (n *Network) Transport(group string) (*Transport, error) {
	var inner *memberlist.NetTransport
	var err error
	// The port the system picks for TCP may be taken for UDP: try a few,
	// as memberlist does for its own transport.
	for range 10 {
		inner, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{"127.0.0.1"},
			BindPort:  0,
			Logger:    n.logger,
		})
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("gossiptest: start transport: %w", err)
	}
	t := &Transport{
		nw:       n,
		group:    group,
		inner:    inner,
		addr:     netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(inner.GetAutoBindPort())),
		packetCh: make(chan *memberlist.Packet),
		streamCh: make(chan net.Conn),
		closing:  make(chan struct{}),
		stop:     make(chan struct{}),
	}
	n.mu.Lock()
	n.groups[t.addr] = group
	n.open[t] = struct{}{}
	n.mu.Unlock()
	t.wg.Add(2)
	go t.relayPackets()
	go t.relayStreams()
	return t, nil
}

// Split cuts the given groups off from each other: from now on, no packet
// and no new stream passes between two transports whose groups are both
// given and differ. Transports of groups not given are not cut off from
// anyone. Split replaces the previous split; Split with fewer than two
// groups heals the Network.
func (n *Network) Split(groups ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.split)
	for _, g := range groups {
		n.split[g] = true
	}
}

// Heal ends the split: every transport may reach every other again.
func (n *Network) Heal() { n.Split() }

// Dropped returns how many packets the Network's transports have dropped,
// outbound and inbound, and how many dials they have refused since the
// Network was created.
func (n *Network) Dropped() (packets, dials int64) {
	return n.droppedPackets.Load(), n.refusedDials.Load()
}

// Shutdown shuts down every transport of the Network still open. Nodes
// normally shut their own transports down when they stop, so call it after
// them (register it with t.Cleanup before starting the nodes).
func (n *Network) Shutdown() {
	n.mu.RLock()
	open := make([]*Transport, 0, len(n.open))
	for t := range n.open {
		open = append(open, t)
	}
	n.mu.RUnlock()
	for _, t := range open {
		_ = t.Shutdown()
	}
}

// cut reports whether group is cut off from the transport bound to to.
func (n *Network) cut(group string, to netip.AddrPort) bool {
	to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	n.mu.RLock()
	defer n.mu.RUnlock()
	other, ok := n.groups[to]
	return ok && other != group && n.split[group] && n.split[other]
}

// cutAddr is cut for a "host:port" string; a host name is never cut.
func (n *Network) cutAddr(group, addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && n.cut(group, ap)
}

// Transport is a memberlist.NodeAwareTransport on 127.0.0.1 whose traffic
// with other groups' transports stops while the Network is split. Create it
// with Network.Transport.
type Transport struct {
	nw       *Network
	group    string
	inner    *memberlist.NetTransport
	addr     netip.AddrPort
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn

	closing chan struct{}  // closed when Shutdown starts: the relays stop delivering
	stop    chan struct{}  // closed once inner is shut down: the relays return
	wg      sync.WaitGroup // the relays

	shutdownOnce sync.Once
	shutdownErr  error
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Addr returns the "127.0.0.1:port" the transport is bound to, UDP and TCP.
func (t *Transport) Addr() string { return t.addr.String() }

// Group returns the transport's group.
func (t *Transport) Group() string { return t.group }

// GetAutoBindPort returns the port the transport is bound to; it is
// memberlist.NetTransport's method, which membership.Join looks for.
func (t *Transport) GetAutoBindPort() int { return int(t.addr.Port()) }

// FinalAdvertiseAddr implements memberlist.Transport: the bound address and
// port, unless ip is set.
func (t *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport. A packet to a
// transport cut off by the split is dropped silently, as a network would:
// the write succeeds.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.nw.cutAddr(t.group, a.Addr) {
		t.nw.droppedPackets.Add(1)
		return time.Now(), nil
	}
	return t.inner.WriteToAddress(b, a)
}

// PacketCh implements memberlist.Transport: the packets received, less
// those from transports cut off by the split.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport. A dial to a
// transport cut off by the split fails at once with ErrPartitioned, where a
// real partition would make it time out: memberlist treats both alike, and
// failure detection runs on its own timers, not on dial times.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.nw.cutAddr(t.group, a.Addr) {
		t.nw.refusedDials.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("%w: %s cannot reach %s", ErrPartitioned, t.group, a.Addr)}
	}
	return t.inner.DialAddressTimeout(a, timeout)
}

// StreamCh implements memberlist.Transport: the stream connections
// accepted. They are not filtered: their remote address is an ephemeral TCP
// port that names no transport. They need not be: memberlist only ever
// opens a stream by dialing from the sending node's transport, and a
// transport refuses to dial across the split, so with every node of the
// test on a transport of the Network no stream crosses it. (Packets carry
// the sender's bound address, so they are filtered on both sides, which
// also drops those already in flight when the split begins.)
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport: it closes the sockets and waits
// for every goroutine of the transport to return. It is safe to call more
// than once; later calls return the first one's result.
func (t *Transport) Shutdown() error {
	t.shutdownOnce.Do(func() {
		t.nw.mu.Lock()
		delete(t.nw.groups, t.addr)
		delete(t.nw.open, t)
		t.nw.mu.Unlock()
		// The node stops reading PacketCh and StreamCh as it shuts down (or
		// never read them), so the relays drop what they still receive from
		// here on. They must go on receiving: the inner transport's
		// listening goroutines may be blocked handing them a packet or a
		// connection, and inner.Shutdown waits for those goroutines.
		close(t.closing)
		t.shutdownErr = t.inner.Shutdown()
		close(t.stop)
		t.wg.Wait()
	})
	return t.shutdownErr
}

// relayPackets forwards the inner transport's packets to PacketCh, less
// those from transports cut off by the split, until Shutdown.
func (t *Transport) relayPackets() {
	defer t.wg.Done()
	in := t.inner.PacketCh()
	for {
		select {
		case p := <-in:
			if from, ok := p.From.(*net.UDPAddr); ok && t.nw.cut(t.group, from.AddrPort()) {
				t.nw.droppedPackets.Add(1)
				continue
			}
			select {
			case t.packetCh <- p:
			case <-t.closing:
			}
		case <-t.stop:
			return
		}
	}
}

// relayStreams forwards the inner transport's connections to StreamCh until
// Shutdown, and closes those nobody takes once Shutdown has begun.
func (t *Transport) relayStreams() {
	defer t.wg.Done()
	in := t.inner.StreamCh()
	for {
		select {
		case c := <-in:
			select {
			case t.streamCh <- c:
			case <-t.closing:
				_ = c.Close()
			}
		case <-t.stop:
			return
		}
	}
}
