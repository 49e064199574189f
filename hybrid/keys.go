package hybrid

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/hybridlimit/hybridlimit/global"
)

// MaxKeyBytes is the longest key a Limiter holds as it is given. Keys
// often come from clients (an API key, a header, a path), and a client may
// send megabytes: a longer key is held, in process, in Redis and in logs,
// as "#" followed by the hex SHA-256 of the key (65 bytes), so that what a
// key costs does not grow with its length. So is a key that starts with
// "#", so that no key given can spell another's digest. Two keys share a
// bucket only if SHA-256 collides.
const MaxKeyBytes = global.MaxKeyBytes

// heldKey is key as the Limiter holds it (see MaxKeyBytes).
func heldKey(key string) string {
	if len(key) <= MaxKeyBytes && !strings.HasPrefix(key, "#") {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(sum[:])
}

// KeyFunc returns the key a request is limited by, for Middleware. An empty
// key means the request has none: Middleware's WithEmptyKey option says what
// happens to it. ClientIP, KeyHeader, KeyRoute, KeyFirst and KeyJoin make
// KeyFuncs; any func(*http.Request) string will do.
type KeyFunc func(*http.Request) string

// maxProxyHops is the longest chain of trusted proxies ClientIP walks
// through. Real deployments have two or three; the bound keeps the work and
// the memory of a request with a huge forwarding header small.
const maxProxyHops = 32

// ClientIP returns a KeyFunc whose key is the address of the client, for
// a service behind reverse proxies whose addresses are in trusted: CIDR
// prefixes ("10.0.0.0/8", "2001:db8::/32") or single addresses. header
// names the field the proxies append the address of their peer to:
// "X-Forwarded-For" (a list of addresses) or "Forwarded" (RFC 7239, whose
// for= parameters are read); the proxies must append to it, and the nearest
// one must add it even if the client did not send it. Only that field is
// read: a client can send any other, and the proxies pass it on untouched.
//
// The key starts as the direct peer (r.RemoteAddr, without its port). If
// the peer is a trusted proxy, the field is walked from right to left,
// since each proxy appends to its right end: the key is the first address
// that is not a trusted proxy, or the leftmost one if every address is. A
// client that is not a trusted proxy can therefore never choose its key
// with the field: whatever it sends is left of the address its proxy
// appends. An element that a trusted proxy wrote but that is not an IP
// address ("unknown", an obfuscated RFC 7239 identifier, garbage), and a
// chain of more than 32 trusted proxies, give the peer's address. Ports,
// IPv6 brackets, zones and RFC 7239 quoting are removed, and IPv4-mapped
// IPv6 addresses are written as IPv4, so every address has one key. If
// r.RemoteAddr is not an IP address (a Unix socket), it is the key as it is.
//
// Without trusted proxies the key is always the peer's address and header
// is not read. Trust only the proxies' own addresses: a prefix that holds
// clients lets those clients choose their key.
//
// An IPv6 client usually holds a whole /64 network and can change its
// address at will; limit it per network with a KeyFunc that masks the
// address returned here, if that matters.
//
// ClientIP returns an error wrapping ErrConfig if an entry of trusted is
// not an IP address or prefix, or if trusted is not empty and header is.
func ClientIP(header string, trusted ...string) (KeyFunc, error) {
	c := clientIP{header: http.CanonicalHeaderKey(header)}
	for _, s := range trusted {
		p, err := parseTrusted(s)
		if err != nil {
			return nil, err
		}
		c.trusted = append(c.trusted, p)
	}
	if len(c.trusted) > 0 && header == "" {
		return nil, fmt.Errorf(`%w: ClientIP: trusted proxies but no header: name the field they append to, "X-Forwarded-For" or "Forwarded"`, ErrConfig)
	}
	return c.key, nil
}

// parseTrusted parses a trusted proxy prefix or address.
func parseTrusted(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%w: ClientIP: trusted proxy %q is not an IP address or CIDR prefix", ErrConfig, s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() {
		// Addresses are compared unmapped.
		if p.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("%w: ClientIP: trusted proxy %q mixes IPv4-mapped and other IPv6 addresses", ErrConfig, s)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// clientIP is the configuration of one ClientIP KeyFunc.
type clientIP struct {
	header  string // canonical
	trusted []netip.Prefix
}

func (c clientIP) key(r *http.Request) string {
	peer, ok := parsePeer(r.RemoteAddr)
	if !ok {
		return r.RemoteAddr
	}
	if !c.isTrusted(peer) {
		return peer.String()
	}
	hops, all := lastElements(r.Header.Values(c.header), c.header == "Forwarded", maxProxyHops)
	key := peer
	for i := len(hops) - 1; i >= 0; i-- {
		node := hops[i]
		if c.header == "Forwarded" {
			node, ok = forwardedFor(node)
			if !ok {
				return peer.String()
			}
		}
		a, ok := parseNode(node)
		if !ok {
			return peer.String()
		}
		if !c.isTrusted(a) {
			return a.String()
		}
		key = a
	}
	if !all {
		return peer.String()
	}
	return key.String()
}

func (c clientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parsePeer parses r.RemoteAddr: host:port as net/http sets it, or a bare
// address.
func parsePeer(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normal(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return normal(a), true
	}
	return netip.Addr{}, false
}

// parseNode parses one address of a forwarding field: an IPv4 address, an
// IPv6 address bare or in brackets, either with a port (digits, or an RFC
// 7239 obfuscated port "_…").
func parseNode(s string) (netip.Addr, bool) {
	host, port, bracketed := s, "", false
	if rest, ok := strings.CutPrefix(s, "["); ok {
		if host, port, ok = strings.Cut(rest, "]"); !ok {
			return netip.Addr{}, false
		}
		if port != "" {
			if port, ok = strings.CutPrefix(port, ":"); !ok {
				return netip.Addr{}, false
			}
		}
		bracketed = true
	} else if h, p, ok := strings.Cut(s, ":"); ok && !strings.Contains(p, ":") {
		// One colon: IPv4 with a port. More: bare IPv6.
		host, port = h, p
		if port == "" {
			return netip.Addr{}, false
		}
	}
	if port != "" && !validPort(port) {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil || bracketed && !a.Is6() {
		return netip.Addr{}, false
	}
	return normal(a), true
}

// validPort reports whether p is a port number or an RFC 7239 obfuscated
// port.
func validPort(p string) bool {
	if p == "" || len(p) > 64 {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		digit := '0' <= c && c <= '9'
		obf := p[0] == '_' && (digit || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '.' || c == '_' || c == '-')
		if !digit && !obf {
			return false
		}
	}
	return true
}

// normal is a with one spelling per address: IPv4-mapped IPv6 as IPv4,
// no zone.
func normal(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

// lastElements returns the last n elements of the comma-separated list
// made of lines, in order, skipping empty ones, and whether that is all of
// them. With quoted, commas inside quoted strings do not separate, unless a
// line ends inside a quoted string: a client may open a quote that would
// swallow the elements proxies append after its own, so such a line is
// split at every comma (the elements proxies append hold no comma).
func lastElements(lines []string, quoted bool, n int) ([]string, bool) {
	ring := make([]string, 0, n)
	next, total := 0, 0
	push := func(e string) {
		if e = strings.TrimSpace(e); e == "" {
			return
		}
		total++
		if len(ring) < n {
			ring = append(ring, e)
			return
		}
		ring[next] = e
		next = (next + 1) % n
	}
	for _, line := range lines {
		start, inQuote := 0, false
		q := quoted && !endsInQuote(line)
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case !q:
				if c == ',' {
					push(line[start:i])
					start = i + 1
				}
			case inQuote && c == '\\':
				i++
			case c == '"':
				inQuote = !inQuote
			case c == ',' && !inQuote:
				push(line[start:i])
				start = i + 1
			}
		}
		push(line[start:])
	}
	if total > n {
		ring = append(ring[next:], ring[:next]...)
	}
	return ring, total <= n
}

// endsInQuote reports whether line ends inside a quoted string.
func endsInQuote(line string) bool {
	in := false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		}
	}
	return in
}

// forwardedFor returns the node of the for= parameter of one element of a
// Forwarded field (RFC 7239 section 4): pairs separated by ';', each a
// token, '=', and a token or a quoted string. It is false if the element
// has no for= parameter, more than one, or cannot be parsed.
func forwardedFor(elem string) (string, bool) {
	var node string
	found := false
	for len(elem) > 0 {
		name, rest, ok := strings.Cut(elem, "=")
		if !ok {
			return "", false
		}
		if name = strings.TrimSpace(name); !isToken(name) {
			return "", false
		}
		rest = strings.TrimLeft(rest, " \t")
		var value string
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' {
					i++
					if i == len(rest) {
						return "", false
					}
				}
				b.WriteByte(rest[i])
			}
			if i == len(rest) {
				return "", false // no closing quote
			}
			value, rest = b.String(), rest[i+1:]
		} else {
			end := strings.IndexByte(rest, ';')
			if end < 0 {
				end = len(rest)
			}
			value, rest = strings.TrimSpace(rest[:end]), rest[end:]
			if strings.ContainsAny(value, "\" \t") {
				return "", false
			}
		}
		rest = strings.TrimLeft(rest, " \t")
		if rest != "" && rest[0] != ';' {
			return "", false
		}
		elem = strings.TrimPrefix(rest, ";")
		if strings.EqualFold(name, "for") {
			if found {
				return "", false
			}
			node, found = value, true
		}
	}
	return node, found
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// KeyHeader returns a KeyFunc whose key is the value of the named request
// header field (the first, if there are several): an API key, a tenant.
// A request without the field has the empty key (see WithEmptyKey).
//
// A client can send any value, so limit by a header only when each value
// costs the client something to obtain (a credential checked before the
// limiter or soon after it), or fall back to the client's address for
// requests without one (KeyFirst): otherwise a client that changes the
// value every request gets a fresh bucket every request.
func KeyHeader(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string { return r.Header.Get(name) }
}

// KeyRoute is a KeyFunc whose key is the request's route: the pattern of
// the http.ServeMux entry that matched it (r.Pattern, such as "GET
// /items/{id}"), or, if there is none, the method and the path ("GET
// /items/42"). Use it to limit a route as a whole, or with KeyJoin to limit
// each client on each route.
//
// r.Pattern is set only inside the mux: wrap the route's handler
// (mux.Handle("GET /items/{id}", mw(h))), not the mux. Outside it, every
// path is its own key, and the client chooses the path.
func KeyRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.Method + " " + r.URL.Path
}

// KeyFirst returns a KeyFunc whose key is the first non-empty key of keys,
// tried in order, prefixed with that KeyFunc's position and a colon:
// KeyFirst(KeyHeader("X-Api-Key"), clientIP) limits each API key, and each
// address for requests without one. The prefix ("0:alice",
// "1:203.0.113.7") keeps the kinds of keys apart, so that no client can
// send as its API key the address of another and drain that client's
// bucket. The key is empty if every key is.
func KeyFirst(keys ...KeyFunc) KeyFunc {
	return func(r *http.Request) string {
		for i, k := range keys {
			if s := k(r); s != "" {
				return fmt.Sprintf("%d:%s", i, s)
			}
		}
		return ""
	}
}

// KeyJoin returns a KeyFunc whose key joins the keys of keys with '|', each
// with its '|' and '\' escaped by a '\', so that different tuples of keys
// never make the same key: KeyJoin(KeyRoute, clientIP) limits each client
// on each route ("GET /items/{id}|203.0.113.7"). The key is empty if any of
// the keys is, so that WithEmptyKey decides what happens to a request that
// lacks a part of its key.
func KeyJoin(keys ...KeyFunc) KeyFunc {
	return func(r *http.Request) string {
		var b strings.Builder
		for i, k := range keys {
			s := k(r)
			if s == "" {
				return ""
			}
			if i > 0 {
				b.WriteByte('|')
			}
			for j := 0; j < len(s); j++ {
				if s[j] == '|' || s[j] == '\\' {
					b.WriteByte('\\')
				}
				b.WriteByte(s[j])
			}
		}
		return b.String()
	}
}
