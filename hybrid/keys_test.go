package hybrid_test

import (
	"cmp"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// trustedProxies are the proxies of the ClientIP tests: a private IPv4
// network, an IPv6 network, a single address, and an IPv4 network written
// IPv4-mapped.
var trustedProxies = []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.1", "::ffff:172.16.0.0/108"}

func TestClientIP(t *testing.T) {
	const client = "203.0.113.7"
	for _, tc := range []struct {
		name   string
		header string // the field the proxies append to
		peer   string // r.RemoteAddr
		fields map[string][]string
		want   string
	}{
		// A client that is not a trusted proxy cannot choose its key.
		{name: "spoof from an untrusted peer", peer: client + ":4711", fields: xff("1.1.1.1"), want: client},
		{name: "spoof of a trusted address", peer: client + ":4711", fields: xff("10.0.0.2"), want: client},
		{name: "spoof with Forwarded", header: "Forwarded", peer: client + ":4711", fields: fwd("for=1.1.1.1"), want: client},
		{name: "spoof through the proxy", peer: "10.0.0.1:80", fields: xff("1.1.1.1, " + client), want: client},
		{name: "spoof of a proxy through the proxy", peer: "10.0.0.1:80", fields: xff("10.9.9.9, " + client), want: client},
		{name: "spoof in an earlier line", peer: "10.0.0.1:80", fields: xff("1.1.1.1", client), want: client},
		{name: "spoof in the other field", peer: "10.0.0.1:80",
			fields: map[string][]string{"X-Forwarded-For": {client}, "Forwarded": {"for=1.1.1.1"}}, want: client},
		{name: "spoof in the other field, Forwarded", header: "Forwarded", peer: "10.0.0.1:80",
			fields: map[string][]string{"X-Forwarded-For": {"1.1.1.1"}, "Forwarded": {"for=" + client}}, want: client},
		// An unterminated quote must not swallow the element the proxy
		// appended, or the client would get the proxy's key.
		{name: "spoof with an unterminated quote", header: "Forwarded", peer: "10.0.0.1:80",
			fields: fwd(`for="1.1.1.1, for=` + client), want: client},
		{name: "spoof with an unterminated quote before an IPv6 client", header: "Forwarded", peer: "10.0.0.1:80",
			fields: fwd(`a=", for="[2001:db8::17]"`), want: "2001:db8::17"},
		{name: "spoof with an escaped quote left open", header: "Forwarded", peer: "10.0.0.1:80",
			fields: fwd(`for="\", for=` + client), want: client},
		{name: "spoof with many addresses", peer: "10.0.0.1:80",
			fields: xff(strings.Repeat("1.1.1.1, ", 1000) + client), want: client},

		// Proxies.
		{name: "no proxy", peer: client + ":4711", want: client},
		{name: "a proxy without the field", peer: "10.0.0.1:80", want: "10.0.0.1"},
		{name: "one proxy", peer: "10.0.0.1:80", fields: xff(client), want: client},
		{name: "a chain of proxies", peer: "10.0.0.1:80", fields: xff(client + ", 10.0.0.2,192.0.2.1"), want: client},
		{name: "a chain over several lines", peer: "10.0.0.1:80", fields: xff(client, "10.0.0.2", "192.0.2.1"), want: client},
		{name: "a chain too long", peer: "10.0.0.1:80", fields: xff(client + strings.Repeat(", 10.0.0.2", 40)), want: "10.0.0.1"},
		{name: "a chain just short enough", peer: "10.0.0.1:80", fields: xff(client + strings.Repeat(", 10.0.0.2", 31)), want: client},
		{name: "every address is a proxy", peer: "10.0.0.1:80", fields: xff("10.0.0.3, 10.0.0.2"), want: "10.0.0.3"},
		{name: "a single trusted address", peer: "192.0.2.1:80", fields: xff(client), want: client},
		{name: "next to the single trusted address", peer: "192.0.2.2:80", fields: xff("1.1.1.1"), want: "192.0.2.2"},
		{name: "a proxy trusted IPv4-mapped", peer: "172.16.0.9:80", fields: xff(client), want: client},
		{name: "empty elements", peer: "10.0.0.1:80", fields: xff(" , "+client+",, ", ""), want: client},

		// IPv6 and ports.
		{name: "IPv6 proxy and client", peer: "[2001:db8:ffff::1]:443", fields: xff("2001:db8::7"), want: "2001:db8::7"},
		{name: "IPv6 client in brackets with a port", peer: "10.0.0.1:80", fields: xff("[2001:db8::7]:5555"), want: "2001:db8::7"},
		{name: "IPv6 client in brackets", peer: "10.0.0.1:80", fields: xff("[2001:DB8:0::7]"), want: "2001:db8::7"},
		{name: "IPv6 client with a zone", peer: "10.0.0.1:80", fields: xff("fe80::1%eth0"), want: "fe80::1"},
		{name: "IPv4 client with a port", peer: "10.0.0.1:80", fields: xff(client + ":5555"), want: client},
		{name: "IPv4-mapped client", peer: "10.0.0.1:80", fields: xff("::ffff:" + client), want: client},
		{name: "IPv4-mapped proxy", peer: "[::ffff:10.0.0.1]:80", fields: xff(client), want: client},
		{name: "IPv4-mapped untrusted peer", peer: "[::ffff:" + client + "]:80", fields: xff("1.1.1.1"), want: client},
		{name: "peer without a port", peer: "10.0.0.1", fields: xff(client), want: client},

		// Forwarded (RFC 7239).
		{name: "Forwarded", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd("for=" + client), want: client},
		{name: "Forwarded, RFC 7239 example", header: "forwarded", peer: "10.0.0.1:80",
			fields: fwd(`for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"`), want: "2001:db8:cafe::17"},
		{name: "Forwarded, a chain", header: "Forwarded", peer: "10.0.0.1:80",
			fields: fwd(`for=1.1.1.1, for=`+client+`;proto=https`, `for="10.0.0.2:8080";by=10.0.0.1`), want: client},
		{name: "Forwarded, quoted, any case", header: "Forwarded", peer: "10.0.0.1:80",
			fields: fwd(`proto=https ; For = "` + client + `"`), want: client},
		{name: "Forwarded, quoted comma on the left", header: "Forwarded", peer: "10.0.0.1:80",
			fields: fwd(`for="_a,b", for=` + client), want: client},
		{name: "Forwarded, obfuscated port", header: "Forwarded", peer: "10.0.0.1:80",
			fields: fwd(`for="` + client + `:_x1"`), want: client},
		{name: "Forwarded, unknown", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd("for=" + client + ", for=unknown"), want: "10.0.0.1"},
		{name: "Forwarded, obfuscated node", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd("for=_hidden"), want: "10.0.0.1"},
		{name: "Forwarded, no for", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd("for=1.1.1.1, proto=https"), want: "10.0.0.1"},
		{name: "Forwarded, two for", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd("for=1.1.1.1;for=" + client), want: "10.0.0.1"},
		{name: "Forwarded, not a pair", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd(client), want: "10.0.0.1"},
		{name: "Forwarded, bad name", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd(`"for"=` + client), want: "10.0.0.1"},
		{name: "Forwarded, junk after a quote", header: "Forwarded", peer: "10.0.0.1:80", fields: fwd(`for="` + client + `"x`), want: "10.0.0.1"},

		// Garbage that a trusted proxy wrote gives the peer; garbage left
		// of the client is the client's own and is never read.
		{name: "garbage", peer: "10.0.0.1:80", fields: xff(client + ", garbage"), want: "10.0.0.1"},
		{name: "garbage left of the client", peer: "10.0.0.1:80", fields: xff("garbage, " + client), want: client},
		{name: "unknown", peer: "10.0.0.1:80", fields: xff("unknown"), want: "10.0.0.1"},
		{name: "a port without an address", peer: "10.0.0.1:80", fields: xff(":80"), want: "10.0.0.1"},
		{name: "an address without a port", peer: "10.0.0.1:80", fields: xff(client + ":"), want: "10.0.0.1"},
		{name: "a bad port", peer: "10.0.0.1:80", fields: xff(client + ":http"), want: "10.0.0.1"},
		{name: "IPv4 in brackets", peer: "10.0.0.1:80", fields: xff("[" + client + "]"), want: "10.0.0.1"},
		{name: "an unclosed bracket", peer: "10.0.0.1:80", fields: xff("[2001:db8::7"), want: "10.0.0.1"},
		{name: "junk after a bracket", peer: "10.0.0.1:80", fields: xff("[2001:db8::7]x"), want: "10.0.0.1"},
		{name: "leading zeros", peer: "10.0.0.1:80", fields: xff("203.0.113.07"), want: "10.0.0.1"},
		{name: "a host name", peer: "10.0.0.1:80", fields: xff("client.example"), want: "10.0.0.1"},
		{name: "a Unix socket peer", peer: "@", fields: xff(client), want: "@"},
		{name: "no peer", peer: "", fields: xff(client), want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, err := hybrid.ClientIP(cmp.Or(tc.header, "X-Forwarded-For"), trustedProxies...)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.peer
			for name, lines := range tc.fields {
				for _, v := range lines {
					r.Header.Add(name, v)
				}
			}
			if got := key(r); got != tc.want {
				t.Errorf("key %q, want %q", got, tc.want)
			}
		})
	}
}

func xff(lines ...string) map[string][]string { return map[string][]string{"X-Forwarded-For": lines} }
func fwd(lines ...string) map[string][]string { return map[string][]string{"Forwarded": lines} }

func TestClientIPConfig(t *testing.T) {
	for _, tc := range []struct {
		header  string
		trusted []string
		ok      bool
	}{
		{"", nil, true},
		{"X-Forwarded-For", nil, true},
		{"X-Forwarded-For", []string{"10.0.0.0/8", "::1", "fd00::/8", "10.1.2.3/8"}, true},
		{"", []string{"10.0.0.0/8"}, false},
		{"X-Forwarded-For", []string{"10.0.0.0/33"}, false},
		{"X-Forwarded-For", []string{"nope"}, false},
		{"X-Forwarded-For", []string{""}, false},
		{"X-Forwarded-For", []string{"fe80::1%eth0"}, false},
		{"X-Forwarded-For", []string{"10.0.0.0/8 "}, false},
		{"X-Forwarded-For", []string{"::ffff:0.0.0.0/90"}, false},
	} {
		key, err := hybrid.ClientIP(tc.header, tc.trusted...)
		if tc.ok != (err == nil) || tc.ok != (key != nil) {
			t.Errorf("ClientIP(%q, %q) = %v, %v", tc.header, tc.trusted, key != nil, err)
		}
		if err != nil && !errors.Is(err, hybrid.ErrConfig) {
			t.Errorf("ClientIP(%q, %q): %v does not wrap ErrConfig", tc.header, tc.trusted, err)
		}
	}
}

// FuzzClientIP: whatever the fields hold, an untrusted peer is its own key,
// and a trusted peer's key is an address in one spelling. Whatever a client
// sends, the address its proxy appends is its key (or, when what it sent
// makes the Forwarded field unreadable, the proxy's).
func FuzzClientIP(f *testing.F) {
	for _, s := range []string{"", "1.1.1.1", "203.0.113.7, 10.0.0.2", `for="[2001:db8::1]:80"`, `for="`, "[::1", ",,,", "::ffff:1.2.3.4", "\x00\xff"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	xffKey, err := hybrid.ClientIP("X-Forwarded-For", trustedProxies...)
	if err != nil {
		f.Fatal(err)
	}
	fwdKey, err := hybrid.ClientIP("Forwarded", trustedProxies...)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, field string, trustedPeer bool) {
		peer := "203.0.113.7"
		if trustedPeer {
			peer = "10.0.0.1"
		}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = peer + ":4711"
		r.Header.Set("X-Forwarded-For", field)
		r.Header.Set("Forwarded", field)
		for _, key := range []hybrid.KeyFunc{xffKey, fwdKey} {
			got := key(r)
			if !trustedPeer && got != peer {
				t.Fatalf("untrusted peer, field %q: key %q", field, got)
			}
			a, err := netip.ParseAddr(got)
			if err != nil || a.String() != got || a.Is4In6() || a.Zone() != "" {
				t.Fatalf("field %q: key %q is not an address in one spelling", field, got)
			}
		}

		const client = "198.51.100.9"
		r.Header.Set("X-Forwarded-For", field+", "+client)
		if got := xffKey(r); got != client && trustedPeer {
			t.Fatalf("X-Forwarded-For %q: key %q, want %q", r.Header.Get("X-Forwarded-For"), got, client)
		}
		r.Header.Set("Forwarded", field+", for="+client)
		if got := fwdKey(r); trustedPeer && got != client && got != peer {
			t.Fatalf("Forwarded %q: key %q, want %q", r.Header.Get("Forwarded"), got, client)
		}
	})
}

func TestKeyHelpers(t *testing.T) {
	ip, err := hybrid.ClientIP("X-Forwarded-For", "10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	apiKey := hybrid.KeyHeader("x-api-key")
	for _, tc := range []struct {
		name    string
		key     hybrid.KeyFunc
		headers map[string]string
		want    string
	}{
		{"header", apiKey, map[string]string{"X-Api-Key": "alice"}, "alice"},
		{"no header", apiKey, nil, ""},
		{"first: the API key", hybrid.KeyFirst(apiKey, ip), map[string]string{"X-Api-Key": "alice"}, "0:alice"},
		{"first: the address", hybrid.KeyFirst(apiKey, ip), nil, "1:192.0.2.1"},
		// An API key that spells an address is not that address's bucket.
		{"first: an address as API key", hybrid.KeyFirst(apiKey, ip), map[string]string{"X-Api-Key": "192.0.2.1"}, "0:192.0.2.1"},
		{"first: none", hybrid.KeyFirst(apiKey, hybrid.KeyHeader("X-User")), nil, ""},
		{"first of nothing", hybrid.KeyFirst(), nil, ""},
		{"join", hybrid.KeyJoin(hybrid.KeyRoute, ip), nil, "GET /items/42|192.0.2.1"},
		{"join escapes", hybrid.KeyJoin(apiKey, hybrid.KeyHeader("X-User")),
			map[string]string{"X-Api-Key": `a|b\`, "X-User": `|c`}, `a\|b\\|\|c`},
		{"join: a part missing", hybrid.KeyJoin(hybrid.KeyRoute, apiKey), nil, ""},
		{"route without a mux", hybrid.KeyRoute, nil, "GET /items/42"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/items/42?x=1", nil)
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			if got := tc.key(r); got != tc.want {
				t.Errorf("key %q, want %q", got, tc.want)
			}
		})
	}

	// Different parts never join into one key.
	a := hybrid.KeyJoin(hybrid.KeyHeader("A"), hybrid.KeyHeader("B"))
	seen := map[string][2]string{}
	for _, p := range [][2]string{{"x|", "y"}, {"x", "|y"}, {`x\`, "y"}, {"x", `\|y`}, {`x\|`, "y"}, {"x", "y"}} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("A", p[0])
		r.Header.Set("B", p[1])
		k := a(r)
		if q, ok := seen[k]; ok {
			t.Errorf("%q and %q both join into %q", q, p, k)
		}
		seen[k] = p
	}
}

// TestKeyRoute: inside a ServeMux the key is the pattern that matched, so
// every item shares the route's bucket.
func TestKeyRoute(t *testing.T) {
	var got []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) { got = append(got, hybrid.KeyRoute(r)) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { got = append(got, hybrid.KeyRoute(r)) })
	for _, path := range []string{"/items/1", "/items/2", "/other"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	want := []string{"GET /items/{id}", "GET /items/{id}", "/"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("keys %q, want %q", got, want)
	}
}
