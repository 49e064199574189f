package grpclimit

import (
	"context"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// ByMetadata returns a KeyFunc that keys a call by the first value of the
// incoming metadata field name, for example "x-api-key", or "" when the call
// has none. name is matched case-insensitively, as gRPC metadata keys are
// lower case. A client chooses what it sends: key by a field that your
// authentication has checked, or the client can pick a fresh key per call.
func ByMetadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) string {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 {
			return v[0]
		}
		return ""
	}
}

// ByPeerIP keys a call by the IP address of the other end of its connection,
// without the port, or "" when it has none (a Unix socket, an in-memory
// connection). Behind a proxy or load balancer that terminates gRPC (HTTP/2),
// this is the proxy's address, shared by all its clients: key by something
// the proxy forwards instead, and only if you trust it.
func ByPeerIP(ctx context.Context, _ string) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return ""
	}
	return ap.Addr().Unmap().WithZone("").String()
}
