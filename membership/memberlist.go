package membership

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// DefaultPort is the port memberlist listens on by convention (TCP and UDP).
const DefaultPort = 7946

// DefaultLeaveTimeout is how long Close waits for each of its two
// announcements (that the node is leaving, then its goodbye) to go out
// when Config.LeaveTimeout is zero.
const DefaultLeaveTimeout = 2 * time.Second

// MaxNameLength is the longest Config.Name Join accepts, in bytes. A node's
// name travels in its leaving notice (see Memberlist.Close), one UDP
// packet, and the other members refuse a notice with a longer one.
const MaxNameLength = 255

// Profile selects memberlist's timing parameters.
type Profile int

const (
	// LAN uses memberlist.DefaultLANConfig: conservative failure detection
	// suited to a data-centre network. It is the zero value.
	LAN Profile = iota
	// Local uses memberlist.DefaultLocalConfig: fast failure detection, for
	// tests and nodes on one host.
	Local
)

// String returns "lan", "local", or "Profile(n)" for unknown values.
func (p Profile) String() string {
	switch p {
	case LAN:
		return "lan"
	case Local:
		return "local"
	default:
		return "Profile(" + strconv.Itoa(int(p)) + ")"
	}
}

// Config configures a memberlist-backed Counter. The zero value starts a new
// single-node cluster on a random port of every interface with the LAN
// profile; DefaultConfig gives the usual production settings.
type Config struct {
	// Name is this node's name, unique in the cluster, at most
	// MaxNameLength bytes long. Empty means the host name followed by a
	// random suffix.
	Name string

	// BindAddr is the address to listen on (TCP and UDP). Empty means
	// "0.0.0.0", every interface.
	BindAddr string

	// BindPort is the port to listen on. Zero means a free port chosen by the
	// system (what tests want); Addr reports the port actually bound.
	BindPort int

	// AdvertiseAddr is the address other members use to reach this node, for
	// when it differs from the bound one (NAT, containers). Empty means the
	// bound address, or a private address of this host when bound to every
	// interface.
	AdvertiseAddr string

	// AdvertisePort is the port other members use to reach this node. Zero
	// means the bound port. Without a Transport it is ignored when BindPort
	// is zero, since the chosen port is only known once bound.
	AdvertisePort int

	// Transport, when set, carries this node's gossip instead of the UDP and
	// TCP listeners memberlist would open: BindAddr and BindPort are then not
	// bound, and the transport decides the address advertised to the other
	// members, given AdvertiseAddr and AdvertisePort. A
	// memberlist.NetTransport (or a wrapper that has its GetAutoBindPort
	// method) advertises where it is bound when AdvertiseAddr is empty, and
	// AdvertiseAddr with its bound port when AdvertisePort is zero. Typical
	// uses are tests (a transport that drops packets between groups of
	// nodes, to make a partition) and custom network layers. Join takes
	// ownership of the transport even when it fails: it is shut down with
	// the node, so its Shutdown must be safe to call more than once, as
	// NetTransport's is. Nil means memberlist's own NetTransport on
	// BindAddr:BindPort.
	Transport memberlist.Transport

	// Seeds are the addresses of members to join, "host:port", or "host"
	// for the port this node binds. A host is an IP address or a DNS name;
	// a name is resolved again at every attempt, and every address it
	// resolves to is tried, so a name that lists the current instances (a
	// Kubernetes headless service) finds them as they come and go. Empty
	// means this node starts a new cluster and never tries to join one.
	//
	// Join returns once a seed answers (this node's own address counts, so
	// the first instance of a deployment whose seeds name every instance
	// starts the cluster), retrying for up to JoinTimeout. Afterwards,
	// whenever the node is alone (every other member left or was declared
	// dead), it tries the seeds again in the background, with the same
	// back-off, until another member is back or Close is called: a healed
	// partition or restarted instances merge again.
	Seeds []string

	// JoinTimeout bounds how long Join keeps trying the seeds while none
	// answers, so that instances started together find each other whatever
	// their order: each listens while it retries. Join always makes one
	// attempt, and one more at the end of JoinTimeout, so a JoinTimeout
	// shorter than an attempt means a single attempt. Zero means
	// DefaultJoinTimeout.
	JoinTimeout time.Duration

	// RetryInterval is the first wait between two attempts to join the
	// seeds, at Join and when the node is alone. Each later wait doubles,
	// up to MaxRetryInterval, and is drawn at random from the upper half
	// of its bound (between half of it and all of it), so that instances
	// that fail together do not retry in step. Zero means
	// DefaultRetryInterval.
	RetryInterval time.Duration

	// MaxRetryInterval caps the wait between two attempts to join the
	// seeds. Zero means DefaultMaxRetryInterval, or RetryInterval if that
	// is longer.
	MaxRetryInterval time.Duration

	// Resolve returns the addresses of a seed's host name, as
	// net.Resolver.LookupHost does. It is called for every seed whose host
	// is not an IP address at every attempt to join, one call at a time,
	// with a context that ends when Join's does or Close is called. Set it
	// to use another resolver or a service registry, or in tests. Nil means
	// net.DefaultResolver.LookupHost.
	Resolve func(ctx context.Context, host string) (addrs []string, err error)

	// SecretKey, when set, encrypts and authenticates gossip with AES-GCM; it
	// must be 16, 24 or 32 bytes long (AES-128, -192 or -256), and every
	// member must use the same key. Nil means no encryption.
	SecretKey []byte

	// MaxInstances is the most members this cluster is expected to have.
	// It does not cap Count: a count below the real number of members
	// would inflate every instance's default share. When the members this
	// node sees exceed it, the node logs a warning once per crossing (two
	// clusters that share seeds or a gossip key may have merged) and Count
	// reports the real number. Zero means no expectation, and no warning.
	MaxInstances int

	// Profile selects memberlist's timing parameters. The zero value is LAN.
	Profile Profile

	// Logger receives this package's logs and memberlist's own log lines, the
	// latter at debug level. Nil means no logging at all.
	Logger *slog.Logger

	// LeaveTimeout bounds each of Close's two waits: for the news that
	// this node is leaving to go out, then for its leave message to reach
	// another member, before shutting down anyway. Zero means
	// DefaultLeaveTimeout.
	LeaveTimeout time.Duration
}

// DefaultConfig returns the configuration for a production node: LAN
// profile, every interface, DefaultPort, DefaultLeaveTimeout,
// DefaultJoinTimeout, DefaultRetryInterval and DefaultMaxRetryInterval.
// The caller adds Seeds and, usually, SecretKey.
func DefaultConfig() Config {
	return Config{
		BindPort:         DefaultPort,
		Profile:          LAN,
		LeaveTimeout:     DefaultLeaveTimeout,
		JoinTimeout:      DefaultJoinTimeout,
		RetryInterval:    DefaultRetryInterval,
		MaxRetryInterval: DefaultMaxRetryInterval,
	}
}

// Memberlist is a Counter backed by a memberlist gossip cluster. Its count
// is the number of members this node believes alive, self included, never
// capped (see Config.MaxInstances for the warning above an expected
// maximum). It is safe for concurrent use. Create it with Join and release
// it with Close.
type Memberlist struct {
	name         string
	addr         string
	maxInstances int
	leaveTimeout time.Duration
	logger       *slog.Logger
	ml           *memberlist.Memberlist
	nt           *notifier
	count        atomic.Int64
	over         bool        // the count exceeds maxInstances; owned by the notifier goroutine (and Join before it starts)
	leaving      atomic.Bool // set when a graceful Close starts; see NodeMeta

	// incarnation tells this process from an earlier or later one of the
	// same name: random, fixed at Join. The others learn it from this
	// node's metadata; its leaving notice carries it.
	incarnation string

	// peers holds every other member as the event delegate last saw it,
	// gone the members that left lately, for their late notices. Leaving
	// notices go to the copies of the addresses in peers, never to
	// memberlist's own *Node, whose fields memberlist rewrites under its
	// lock (a member's metadata update rewrites its address too) while a
	// send would read them without it.
	peersMu sync.Mutex
	peers   map[string]peer      // guarded by peersMu
	gone    map[string]departure // guarded by peersMu

	// Joining the seeds, at Join and in the background.
	seeds            []seed
	resolve          func(ctx context.Context, host string) ([]string, error)
	retryInterval    time.Duration
	maxRetryInterval time.Duration
	changed          chan struct{} // capacity 1; signalled when a member joins or leaves
	stopRejoin       context.CancelFunc
	rejoinDone       chan struct{} // closed when rejoinLoop returns; nil without seeds

	// nameTaken is the address of another node that claims this node's
	// name while it is live (memberlist's conflict), if one has.
	nameTaken atomic.Pointer[string]

	closeOnce sync.Once
	closeErr  error
}

// Join is shorthand for JoinContext(context.Background(), cfg).
func Join(cfg Config) (*Memberlist, error) {
	return JoinContext(context.Background(), cfg)
}

// JoinContext starts a memberlist node configured by cfg and joins the
// cluster of cfg.Seeds, or starts a new cluster when there are none.
//
// While no seed answers, JoinContext waits and tries again, with the
// back-off of cfg.RetryInterval and cfg.MaxRetryInterval, resolving seed
// names afresh each time. The node listens all the while, so instances
// started together, each seeding the others, find each other whatever
// their order. JoinContext returns the node once a seed answers or another
// member joins it. It gives up when cfg.JoinTimeout has passed or ctx
// ends: it then shuts the node down (it does not keep trying in the
// background: the caller has no node to close) and returns an error
// wrapping ErrJoin, and ctx's error if ctx ended, that names the seeds and
// says why the last attempt failed. A connection to a seed in progress
// when ctx ends is not interrupted: it ends within memberlist's TCP timeout
// (10 s with the LAN profile, 1 s with Local).
//
// Once joined, a node with seeds tries them again in the background
// whenever it is alone, until Close (see Config.Seeds).
//
// It returns an error wrapping ErrInvalidConfig if cfg is unusable,
// ErrStart if the node cannot be started (for example, the address is in
// use), or ErrNameInUse if a live member already has cfg.Name at another
// address (a copied configuration, two processes of one host given the
// host name): memberlist would count the two as one.
func JoinContext(ctx context.Context, cfg Config) (_ *Memberlist, err error) {
	if cfg.Transport != nil {
		defer func() {
			if err != nil {
				// memberlist shuts the transport down on most of its own
				// failures but not all; ours (invalid config) leave it open.
				_ = cfg.Transport.Shutdown()
			}
		}()
	}
	conf, err := memberlistConfig(&cfg)
	if err != nil {
		return nil, err
	}
	m := newMemberlist(&cfg, conf.Name)
	conf.Events = eventDelegate{m}
	conf.Delegate = delegate{m}
	conf.Conflict = conflictDelegate{m}

	ml, err := memberlist.Create(conf)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrStart, conf.Name, err)
	}
	m.ml = ml
	node := ml.LocalNode()
	m.addr = net.JoinHostPort(node.Addr.String(), strconv.Itoa(int(node.Port)))

	if len(cfg.Seeds) > 0 {
		// memberlist has set conf.BindPort to the port it bound, which is
		// what it gives seeds without one.
		if m.seeds, err = parseSeeds(cfg.Seeds, conf.BindPort); err == nil {
			err = m.join(ctx, cmp.Or(cfg.JoinTimeout, DefaultJoinTimeout))
		}
		if err == nil {
			err = m.nameFree()
		}
		if err != nil {
			// No Leave: a leave in this name would say that the live
			// member of the name left.
			_ = ml.Shutdown()
			return nil, err
		}
	}
	m.refresh()
	m.nt.start()
	if len(m.seeds) > 0 {
		var bg context.Context
		bg, m.stopRejoin = context.WithCancel(context.Background())
		m.rejoinDone = make(chan struct{})
		go m.rejoinLoop(bg)
	}
	m.logger.Info("membership: joined", "name", m.name, "addr", m.addr, "count", m.Count(), "seeds", len(cfg.Seeds))
	return m, nil
}

// newMemberlist is the Memberlist of cfg, named name, before its node
// starts.
func newMemberlist(cfg *Config, name string) *Memberlist {
	m := &Memberlist{
		name:             name,
		maxInstances:     cfg.MaxInstances,
		leaveTimeout:     cmp.Or(cfg.LeaveTimeout, DefaultLeaveTimeout),
		logger:           cfg.Logger,
		resolve:          cfg.Resolve,
		retryInterval:    cmp.Or(cfg.RetryInterval, DefaultRetryInterval),
		maxRetryInterval: cfg.MaxRetryInterval,
		changed:          make(chan struct{}, 1),
		incarnation:      newIncarnation(),
	}
	if m.logger == nil {
		m.logger = slog.New(slog.DiscardHandler)
	}
	if m.maxRetryInterval == 0 {
		m.maxRetryInterval = max(DefaultMaxRetryInterval, m.retryInterval)
	}
	if m.resolve == nil {
		m.resolve = net.DefaultResolver.LookupHost
	}
	m.count.Store(1)
	m.nt = newNotifier(m.refresh, m.Count, true)
	return m
}

// checkConfig returns an error wrapping ErrInvalidConfig for a field of
// cfg that Join cannot use.
func checkConfig(cfg *Config) error {
	if k := len(cfg.SecretKey); k != 0 && k != 16 && k != 24 && k != 32 {
		return fmt.Errorf("%w: secret key is %d bytes, want 16, 24 or 32", ErrInvalidConfig, k)
	}
	if len(cfg.Name) > MaxNameLength {
		return fmt.Errorf("%w: Name is %d bytes, at most %d", ErrInvalidConfig, len(cfg.Name), MaxNameLength)
	}
	if cfg.MaxInstances < 0 {
		return fmt.Errorf("%w: negative MaxInstances %d", ErrInvalidConfig, cfg.MaxInstances)
	}
	if cfg.LeaveTimeout < 0 {
		return fmt.Errorf("%w: negative LeaveTimeout %v", ErrInvalidConfig, cfg.LeaveTimeout)
	}
	if cfg.JoinTimeout < 0 || cfg.RetryInterval < 0 || cfg.MaxRetryInterval < 0 {
		return fmt.Errorf("%w: negative JoinTimeout, RetryInterval or MaxRetryInterval", ErrInvalidConfig)
	}
	if cfg.MaxRetryInterval > 0 && cfg.MaxRetryInterval < cfg.RetryInterval {
		return fmt.Errorf("%w: MaxRetryInterval %v is below RetryInterval %v", ErrInvalidConfig, cfg.MaxRetryInterval, cfg.RetryInterval)
	}
	if _, err := parseSeeds(cfg.Seeds, DefaultPort); err != nil {
		return err
	}
	if cfg.BindPort < 0 || cfg.BindPort > 65535 || cfg.AdvertisePort < 0 || cfg.AdvertisePort > 65535 {
		return fmt.Errorf("%w: port out of range", ErrInvalidConfig)
	}
	return nil
}

// memberlistConfig validates cfg and translates it.
func memberlistConfig(cfg *Config) (*memberlist.Config, error) {
	var conf *memberlist.Config
	switch cfg.Profile {
	case LAN:
		conf = memberlist.DefaultLANConfig()
	case Local:
		conf = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("%w: unknown profile %v", ErrInvalidConfig, cfg.Profile)
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	conf.Name = cfg.Name
	if conf.Name == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "node"
		}
		suffix := "-" + randomSuffix()
		conf.Name = host[:min(len(host), MaxNameLength-len(suffix))] + suffix
	}
	conf.BindAddr = cfg.BindAddr
	if conf.BindAddr == "" {
		conf.BindAddr = "0.0.0.0"
	}
	conf.BindPort = cfg.BindPort
	conf.AdvertiseAddr = cfg.AdvertiseAddr
	conf.AdvertisePort = cfg.AdvertisePort
	switch {
	case cfg.Transport != nil:
		conf.Transport = cfg.Transport
		// memberlist asks the transport what to advertise, passing
		// AdvertiseAddr and AdvertisePort. NetTransport ignores the port when
		// the address is empty (it advertises its bound address and port),
		// but takes it as given otherwise, zero included; and BindPort says
		// nothing of where a transport is bound. So the bound port has to
		// come from the transport.
		if b, ok := cfg.Transport.(interface{ GetAutoBindPort() int }); ok && conf.AdvertisePort == 0 {
			conf.AdvertisePort = b.GetAutoBindPort()
		}
	case conf.AdvertisePort == 0:
		conf.AdvertisePort = cfg.BindPort // memberlist replaces 0 by the chosen port
	}
	if len(cfg.SecretKey) > 0 {
		conf.SecretKey = slices.Clone(cfg.SecretKey)
	}
	if cfg.Logger != nil {
		conf.Logger = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
	} else {
		conf.Logger = log.New(io.Discard, "", 0) // memberlist would log to stderr
	}
	return conf, nil
}

// refresh recomputes the count and the members from memberlist's view. It
// runs on the notifier goroutine (and once in Join), never inside a
// memberlist callback, where memberlist holds the lock Members takes.
func (m *Memberlist) refresh() (int, []string) {
	members := m.Members()
	n := max(len(members), 1)
	over := m.maxInstances > 0 && n > m.maxInstances
	if over && !m.over {
		m.logger.Warn("membership: more members than MaxInstances: check that two clusters have not merged",
			"name", m.name, "members", n, "max_instances", m.maxInstances)
	}
	m.over = over
	if old := m.count.Swap(int64(n)); old != int64(n) {
		m.logger.Debug("membership: count changed", "name", m.name, "from", old, "to", n)
	}
	return n, members
}

// Name returns this node's name in the cluster.
func (m *Memberlist) Name() string { return m.name }

// Count returns the number of live members, self included, at least 1,
// also when that exceeds Config.MaxInstances. It is a single atomic load.
// After Close it keeps returning the last count.
func (m *Memberlist) Count() int { return int(m.count.Load()) }

// Watch implements Counter. Watchers registered after Close are never
// called.
func (m *Memberlist) Watch(fn func(n int)) (stop func()) { return m.nt.watch(fn) }

// View implements Roster: the members this node believes alive, and their
// count.
func (m *Memberlist) View() View {
	members := m.Members()
	return View{Count: max(len(members), 1), Members: members}
}

// WatchView implements Roster. A member is in a View's Left when its Close
// announced that it was leaving (in a notice and in its memberlist
// metadata, before its goodbye) and this node heard it. A member that crashed, was shut down
// without Close or is cut off by a partition is declared dead by failure
// detection instead, and is never in Left; nor is one whose announcement
// this node missed: it counts as failed, the safe side. Watchers
// registered after Close are never called.
func (m *Memberlist) WatchView(fn func(View)) (stop func()) {
	return m.nt.watchView(fn, m.Members())
}

// Addr returns the "host:port" other nodes use to reach this one, to be
// given to them as a seed. With BindPort zero it carries the chosen port.
func (m *Memberlist) Addr() string { return m.addr }

// Members implements Roster: the names of the members this node believes
// alive, self included, sorted.
func (m *Memberlist) Members() []string {
	nodes := m.ml.Members()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	slices.Sort(names)
	return names
}

// Close stops trying the seeds in the background (waiting for a
// connection to a seed in progress, which ends within memberlist's TCP
// timeout), leaves the cluster gracefully (the other members report this
// node in a View's Left, and may stop counting it at once: whatever used
// this node's count must have stopped before Close, as hybrid.Limiter.Close
// does when it closes its Members), waiting at most
// Config.LeaveTimeout for the leave message to reach another member, then
// shuts the node down and stops the goroutine that calls watchers. A leave
// that times out is logged, not returned: the node is shut down all the
// same and the other members notice the departure through failure
// detection instead. Close is idempotent: later calls return the first
// call's result. It must not be called from a watcher.
func (m *Memberlist) Close() error {
	return m.close(true)
}

// close shuts the node down, after a graceful leave when leave is set.
// Without leave it simulates a crash, for tests.
func (m *Memberlist) close(leave bool) error {
	m.closeOnce.Do(func() {
		if m.stopRejoin != nil {
			m.stopRejoin()
			<-m.rejoinDone
		}
		var errs []error
		if leave {
			// Tell the others that this node is leaving, so that they
			// report its departure as graceful (see NotifyLeave): a notice
			// to each (fast, but one UDP packet), and this node's metadata,
			// which gossip spreads; wait for that to go out, as the goodbye
			// that follows would replace it in memberlist's broadcast
			// queue. A member that hears neither before the goodbye takes
			// the departure for a failure: the safe side.
			m.leaving.Store(true)
			m.announceLeaving()
			if err := m.ml.UpdateNode(m.leaveTimeout); err != nil {
				m.logger.Warn("membership: leaving not announced in time; the others may take the departure for a failure", "name", m.name, "timeout", m.leaveTimeout, "err", err)
			}
			m.announceLeaving()
			switch err := m.ml.Leave(m.leaveTimeout); {
			case err == nil:
			case strings.Contains(err.Error(), "timeout"):
				// Nobody confirmed the goodbye in time (for example when
				// several nodes stop at once): the others notice through
				// failure detection instead. Not worth failing Close for.
				m.logger.Warn("membership: leave not confirmed in time; the others will detect the departure", "name", m.name, "timeout", m.leaveTimeout)
			default:
				errs = append(errs, fmt.Errorf("membership: leave %q: %w", m.name, err))
			}
		}
		if err := m.ml.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("membership: shutdown %q: %w", m.name, err))
		}
		m.nt.close()
		m.closeErr = errors.Join(errs...)
		m.logger.Info("membership: closed", "name", m.name, "graceful", leave, "err", m.closeErr)
	})
	return m.closeErr
}

// nameFree returns an error wrapping ErrNameInUse if, while joining, a
// member reported another node live under this node's name.
func (m *Memberlist) nameFree() error {
	if addr := m.nameTaken.Load(); addr != nil {
		return fmt.Errorf("%w: %q is live at %s: give each instance its own Config.Name, "+
			"or leave Name empty for one unique to the process", ErrNameInUse, m.name, *addr)
	}
	return nil
}

// conflictDelegate hears from memberlist of two nodes that claim one name
// from different addresses while the first is live. memberlist keeps the
// first and ignores the other, so both would decide while counted once.
type conflictDelegate struct{ m *Memberlist }

func (d conflictDelegate) NotifyConflict(existing, other *memberlist.Node) {
	if existing.Name != d.m.name {
		d.m.logger.Error("membership: two nodes claim one name: the second is not counted",
			"name", existing.Name, "addr", existing.Address(), "other_addr", other.Address())
		return
	}
	addr := other.Address()
	d.m.nameTaken.CompareAndSwap(nil, &addr)
	d.m.logger.Error("membership: another node claims this node's name: give each instance its own name",
		"name", existing.Name, "addr", existing.Address(), "other_addr", addr)
}

// eventDelegate turns memberlist's membership events into wake-ups of the
// notifier goroutine and of whatever is joining the seeds. Its methods
// never block.
type eventDelegate struct{ m *Memberlist }

func (d eventDelegate) NotifyUpdate(n *memberlist.Node) {
	d.m.setPeer(n)
	d.m.nt.signal()
}

// peer is another member as this node knows it: its address, its
// incarnation (from its metadata), and whether a notice from that
// incarnation said it is leaving.
type peer struct {
	addr    memberlist.Address
	inc     string
	leaving bool
}

// setPeer records member n's address and incarnation, read while
// memberlist holds the lock under which it calls its event delegate. A
// member whose incarnation changed is another process: what its
// predecessor said no longer holds.
func (m *Memberlist) setPeer(n *memberlist.Node) {
	if n.Name == m.name {
		return
	}
	inc, _ := parseMeta(n.Meta)
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	if m.peers == nil {
		m.peers = make(map[string]peer)
	}
	p := m.peers[n.Name]
	p.addr = memberlist.Address{Addr: n.Address(), Name: n.Name}
	if p.inc != inc {
		p.inc, p.leaving = inc, false
	}
	m.peers[n.Name] = p
}

// addresses returns the addresses of the other members.
func (m *Memberlist) addresses() []memberlist.Address {
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	out := make([]memberlist.Address, 0, len(m.peers))
	for _, p := range m.peers {
		out = append(out, p.addr)
	}
	return out
}

// NotifyJoin records a member that joins: a new process, or one that came
// back, which has said nothing yet.
func (d eventDelegate) NotifyJoin(n *memberlist.Node) {
	if n.Name != d.m.name {
		d.m.peersMu.Lock()
		delete(d.m.peers, n.Name)
		d.m.peersMu.Unlock()
	}
	d.m.setPeer(n)
	d.m.membersChanged()
}

// NotifyLeave reports a node that said it was leaving (see close), in its
// metadata or in a notice this node heard, as a graceful leave. memberlist
// marks a node that sent its own goodbye StateLeft rather than StateDead,
// but does not tell the event delegate which (v0.5.4 hands it the node's
// Node.State, which it never updates), so the node says so itself before
// its goodbye. A node that never said so, or whose word did not arrive
// before its departure, is a failure, whatever the cause.
func (d eventDelegate) NotifyLeave(n *memberlist.Node) {
	if n.Name == d.m.name {
		d.m.membersChanged()
		return
	}
	inc, leaving := parseMeta(n.Meta)
	d.m.peersMu.Lock()
	p := d.m.peers[n.Name]
	graceful := leaving || p.leaving
	delete(d.m.peers, n.Name)
	d.m.departed(n.Name, departure{inc: inc, graceful: graceful, at: time.Now()})
	d.m.peersMu.Unlock()
	if graceful {
		d.m.nt.left(n.Name)
	}
	d.m.membersChanged()
}

// departure is what a node remembers of a member that left: its
// incarnation then, whether its leave was reported as graceful, and when.
type departure struct {
	inc      string
	graceful bool
	at       time.Time
}

// goneFor is how long a node remembers a departed member for its late
// leaving notice: far longer than a packet is ever late, short enough that
// a cluster whose members come and go under fresh names keeps few. A
// notice later than that leaves the departure a failure: the safe side.
const goneFor = time.Minute

// departed records d, the departure of the member named name, and forgets
// departures older than goneFor. Requires peersMu held.
func (m *Memberlist) departed(name string, d departure) {
	if m.gone == nil {
		m.gone = make(map[string]departure)
	}
	for k, g := range m.gone {
		if d.at.Sub(g.at) > goneFor {
			delete(m.gone, k)
		}
	}
	m.gone[name] = d
}

// heardLeaving records a notice that the node named name, in incarnation
// inc, is leaving. Only the process that sent it is meant: a notice from
// an earlier process of that name (a late or repeated packet, arriving
// after a new process took the name) says nothing of the one there now.
// A notice that arrives after this node already took the departure for a
// failure (its packet overtaken by the goodbye or by failure detection)
// reports the leave then, once: the leaver had stopped its work before
// sending it, so counting it out late is as safe as on time. A notice
// from a node this node never saw is dropped: there is nothing to count
// out.
func (m *Memberlist) heardLeaving(name, inc string) {
	if name == m.name {
		return
	}
	m.peersMu.Lock()
	if p, ok := m.peers[name]; ok {
		if p.inc == inc {
			p.leaving = true
			m.peers[name] = p
		}
		m.peersMu.Unlock()
		return
	}
	g, ok := m.gone[name]
	late := ok && g.inc == inc && !g.graceful
	if late {
		g.graceful = true
		m.gone[name] = g
	}
	m.peersMu.Unlock()
	if late {
		m.nt.left(name)
		m.membersChanged()
	}
}

// announceLeaving sends every other member this node believes alive a
// notice that it is leaving, best effort, one UDP packet each.
func (m *Memberlist) announceLeaving() {
	notice := appendLeaving(nil, m.name, m.incarnation)
	for _, a := range m.addresses() {
		_ = m.ml.SendToAddress(a, notice) // the metadata is the fallback
	}
}

// frameLeaving is the first byte of a node's leaving notice (see close).
// Keep its value: nodes of earlier versions of this package know it (they
// also sent packets of another kind, which NotifyMsg ignores).
const frameLeaving = 0x80

// appendLeaving appends the wire form of the notice that from, in its
// incarnation inc, is leaving: frameLeaving, the sender's name preceded by
// its length (a uvarint; memberlist does not tell a receiver who sent a
// packet), then the incarnation (see Memberlist.incarnation), the rest of
// the packet.
func appendLeaving(dst []byte, from, inc string) []byte {
	dst = append(dst, frameLeaving)
	dst = binary.AppendUvarint(dst, uint64(len(from)))
	dst = append(dst, from...)
	return append(dst, inc...)
}

// parseLeaving returns the sender of a notice made by appendLeaving and
// its incarnation, and false for anything else (a notice without an
// incarnation included: a process's notice must not be taken for another
// one's of the same name).
func parseLeaving(b []byte) (from, inc []byte, ok bool) {
	if len(b) < 1 || b[0] != frameLeaving {
		return nil, nil, false
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n == 0 || n > MaxNameLength || n >= uint64(len(b)-k) {
		return nil, nil, false
	}
	inc = b[k+int(n):]
	if len(inc) > maxIncarnation {
		return nil, nil, false
	}
	return b[k : k+int(n)], inc, true
}

// A node's memberlist metadata is metaPrefix and its incarnation, or,
// once its Close has started, metaLeaving and its incarnation: the other
// members then report its departure as graceful.
const (
	metaPrefix  = "hybridlimit:"
	metaLeaving = "hybridlimit:leaving:"
	// maxIncarnation bounds an incarnation read from the wire.
	maxIncarnation = 64
)

// appendMeta appends the metadata of a node in incarnation inc, leaving or
// not.
func appendMeta(dst []byte, inc string, leaving bool) []byte {
	if leaving {
		return append(append(dst, metaLeaving...), inc...)
	}
	return append(append(dst, metaPrefix...), inc...)
}

// parseMeta returns the incarnation in a node's metadata, and whether the
// node is leaving. Metadata it does not know (none, or another program's)
// gives the empty incarnation, not leaving.
func parseMeta(b []byte) (inc string, leaving bool) {
	switch s := string(b); {
	case strings.HasPrefix(s, metaLeaving):
		return s[len(metaLeaving):], true
	case strings.HasPrefix(s, metaPrefix):
		return s[len(metaPrefix):], false
	}
	return "", false
}

// newIncarnation returns a fresh random incarnation: 16 hexadecimal digits.
func newIncarnation() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return hex.EncodeToString(b[:])
}

func (m *Memberlist) membersChanged() {
	m.nt.signal()
	select {
	case m.changed <- struct{}{}:
	default: // a wake-up is pending; the woken reads the latest state.
	}
}

// joinError flattens memberlist's multi-line multierror into one line while
// keeping the individual errors reachable through errors.Is and errors.As.
type joinError struct{ errs []error }

func (e joinError) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e joinError) Unwrap() []error { return e.errs }

func flatten(err error) error {
	var multi interface{ WrappedErrors() []error }
	if errors.As(err, &multi) {
		if errs := multi.WrappedErrors(); len(errs) > 0 {
			return joinError{errs}
		}
	}
	return err
}

// delegate is memberlist's Delegate: NotifyMsg hears the other members'
// leaving notices, on memberlist's packet goroutine, and never blocks;
// NodeMeta says that this node is leaving. memberlist's hooks for
// gossiping state are not used.
type delegate struct{ m *Memberlist }

// NotifyMsg records a leaving notice (see heardLeaving) and ignores
// anything else, such as the messages of nodes of an earlier version of
// this package.
func (d delegate) NotifyMsg(b []byte) {
	if from, inc, ok := parseLeaving(b); ok {
		d.m.heardLeaving(string(from), string(inc)) // which ignores this node's own
	}
}

// NodeMeta is the node's incarnation, marked leaving once Close has
// started (see appendMeta).
func (d delegate) NodeMeta(limit int) []byte {
	return appendMeta(nil, d.m.incarnation, d.m.leaving.Load())
}

func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}
