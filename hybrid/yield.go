package hybrid

import (
	"encoding/binary"
	"sync"

	"github.com/hybridlimit/hybridlimit/internal/shrink"
	"github.com/hybridlimit/hybridlimit/membership"
)

// Asking the peers to yield (DESIGN.md, "Asking for more"). An instance that
// needs more of a key than Redis can grant while its peers run their default
// shares asks them, over membership, to give up what they do not use. The
// asks of one tick go out together, in as few messages as fit; a peer
// handles them at its next tick (engine.yieldAsked). Nothing here waits: a
// lost ask only means the asker asks again at its next renewal.

// The first byte of a message says what its (limit, key) pairs are:
// askVersion, asks to yield; freedVersion, keys whose contended grant the
// sender gave up in part (engine.freed). A receiver ignores a kind it does
// not know.
const (
	askVersion   = 1
	freedVersion = 2
)

// maxAskKey bounds the keys asked about: longer ones are not asked about,
// and keep their default shares everywhere.
const maxAskKey = 256

// ask is one (limit, key) a peer asked this instance to yield or, if
// freed, told it that it gave up in part.
type ask struct {
	limit, key string
	freed      bool
}

// inbox holds the asks received since the loop last took them, at most
// maxInbox of them: beyond that they are dropped, as a lost message would be.
type inbox struct {
	mu   sync.Mutex
	asks []ask
}

const maxInbox = 1 << 16

// receive decodes msg and keeps its asks. It runs on the messenger's
// goroutine and never blocks for long.
func (in *inbox) receive(_ string, msg []byte) {
	if len(msg) < 1 || (msg[0] != askVersion && msg[0] != freedVersion) {
		return
	}
	freed := msg[0] == freedVersion
	msg = msg[1:]
	in.mu.Lock()
	defer in.mu.Unlock()
	for len(msg) > 0 && len(in.asks) < maxInbox {
		limit, rest, ok := field(msg)
		if !ok {
			return
		}
		key, rest, ok := field(rest)
		if !ok {
			return
		}
		in.asks = append(in.asks, ask{limit, key, freed})
		msg = rest
	}
}

// take returns the asks received so far, in dst, and empties the inbox.
func (in *inbox) take(dst []ask) []ask {
	in.mu.Lock()
	defer in.mu.Unlock()
	dst = append(dst[:0], in.asks...)
	in.asks = shrink.Slice(in.asks)
	return dst
}

// field reads one length-prefixed string off b.
func field(b []byte) (string, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return "", nil, false
	}
	return string(b[k : k+int(n)]), b[k+int(n):], true
}

// outbox batches one tick's asks, or one tick's freed keys, into messages
// of at most membership.MaxMessage bytes, each starting with version.
type outbox struct {
	version byte
	msg     []byte
}

// send broadcasts the asks about keys of limit, flushing full messages
// through m; flush sends what is left.
func (o *outbox) add(m membership.Messenger, limit string, keys []string) {
	for _, k := range keys {
		if len(k) > maxAskKey {
			continue
		}
		need := 2*binary.MaxVarintLen16 + len(limit) + len(k)
		if len(o.msg) > 0 && len(o.msg)+need > membership.MaxMessage {
			o.flush(m)
		}
		if len(o.msg) == 0 {
			o.msg = append(o.msg, o.version)
		}
		o.msg = binary.AppendUvarint(o.msg, uint64(len(limit)))
		o.msg = append(o.msg, limit...)
		o.msg = binary.AppendUvarint(o.msg, uint64(len(k)))
		o.msg = append(o.msg, k...)
	}
}

// flush broadcasts the pending message, if any. A failed broadcast is a
// lost ask: the asker asks again at its next renewal.
func (o *outbox) flush(m membership.Messenger) {
	if len(o.msg) > 0 {
		_ = m.Broadcast(o.msg)
	}
	o.msg = o.msg[:0]
}
