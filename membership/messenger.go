package membership

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// MaxMessage is the largest message, in bytes, that Broadcast and Send
// accept. A message travels in one UDP packet with its sender's name (at
// most MaxNameLength bytes) and memberlist's own framing, checksum and
// encryption (51 bytes at most, without a memberlist label). Together they
// stay within the 1400 bytes to which memberlist bounds its packets
// (UDPBufferSize), so that a message fits one Ethernet frame and is never
// fragmented on the way.
const MaxMessage = 1024

// MaxNameLength is the longest Config.Name Join accepts, in bytes: every
// message carries its sender's name, and a message of MaxMessage bytes
// from a node with the longest name must still fit one packet.
const MaxNameLength = 255

// messageQueue is how many received messages wait for the receivers at
// most. A receiver that keeps up with a few messages per peer per tick
// never comes near it; one that stalls loses the excess instead of
// stalling gossip (Memberlist) or the sender (Static on a Bus), and the
// queue bounds the memory held meanwhile (at most about 1.3 MB).
const messageQueue = 256

// Messenger sends small messages to the other live members of a cluster,
// best effort. It is how instances ask each other for unused shares of a
// limit without a round trip to Redis. Implementations are safe for
// concurrent use; *Memberlist and *Static (connected to a Bus) implement
// it.
//
// Delivery is best effort: a message may be lost, for example when a
// packet is dropped on the network or the receiver's queue is full, but it
// is never corrupted, split or merged with another. Messages from one
// sender may arrive in another order than they were sent. A node never
// receives its own messages.
type Messenger interface {
	// Broadcast sends msg to every other live member. It does not wait for
	// the network: it hands one packet per member to the transport and
	// returns. msg must be at most MaxMessage bytes long, or Broadcast
	// returns an error wrapping ErrMessageTooLarge and sends nothing. The
	// caller may reuse msg once Broadcast returns. An error naming the
	// members whose packet could not be handed over means nothing about
	// the others.
	Broadcast(msg []byte) error

	// Send sends msg to the live member named to (its Name), best effort,
	// as Broadcast does. It returns an error wrapping ErrUnknownMember if no
	// live member has that name, and ErrMessageTooLarge if msg is longer
	// than MaxMessage. Sending to this node's own name does nothing and
	// returns nil.
	Send(to string, msg []byte) error

	// Receive registers fn to be called with the sender's name and each
	// message received after Receive was called. fn is called from a
	// goroutine owned by the Messenger, never concurrently with itself or
	// with the other receivers, in arrival order; every registered fn sees
	// every message, in the order they were registered. fn must not block,
	// must not retain msg after it returns (copy what it needs) and must not
	// modify it.
	//
	// Received messages wait in a bounded queue. Messages that arrive while
	// no fn is registered, or while the queue is full because the receivers
	// do not keep up, are dropped and counted by Dropped.
	//
	// Receive returns a function that stops the calls: it is safe to call
	// more than once, and after it returns fn is not running and will not be
	// called again. Because it waits for a running fn to return, stop must
	// not be called from fn.
	Receive(fn func(from string, msg []byte)) (stop func())

	// Dropped returns how many received messages were not delivered to any
	// receiver: none was registered, the queue was full, or the message was
	// malformed (from something that is not a member of this version of the
	// package). It only grows.
	Dropped() uint64
}

// checkSize returns an error wrapping ErrMessageTooLarge if msg is too long
// to send.
func checkSize(op, name string, msg []byte) error {
	if len(msg) > MaxMessage {
		return fmt.Errorf("%w: %s from %q: %d bytes, at most %d", ErrMessageTooLarge, op, name, len(msg), MaxMessage)
	}
	return nil
}

// frameVersion is the first byte of every message on the wire, so that a
// later format can be told apart (and dropped by this one).
const frameVersion = 1

// appendFrame appends the wire form of a message to dst: the version, the
// sender's name preceded by its length (a uvarint), then the message.
// memberlist does not tell a receiver who sent a packet, hence the name.
func appendFrame(dst []byte, from string, msg []byte) []byte {
	dst = append(dst, frameVersion)
	dst = binary.AppendUvarint(dst, uint64(len(from)))
	dst = append(dst, from...)
	return append(dst, msg...)
}

// frameLeaving is the first byte of a node's notice that it is leaving
// (see Memberlist.close): the sender's name follows as in appendFrame, then
// its incarnation (see Memberlist.incarnation), the rest of the packet. It
// is far from frameVersion, so that later versions of the message frame
// keep the small numbers; nodes that know only frameVersion drop it.
const frameLeaving = 0x80

// appendLeaving appends the wire form of the notice that from, in its
// incarnation inc, is leaving.
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

// parseFrame splits a frame made by appendFrame. It reports false for
// anything else: another version, a truncated name, an empty name or a
// message longer than MaxMessage.
func parseFrame(b []byte) (from, msg []byte, ok bool) {
	if len(b) < 1 || b[0] != frameVersion {
		return nil, nil, false
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n == 0 || n > MaxNameLength || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	from, msg = b[k:k+int(n)], b[k+int(n):]
	if len(msg) > MaxMessage {
		return nil, nil, false
	}
	return from, msg, true
}

// inbox queues received messages and delivers them to the receivers from
// one goroutine, which runs only while there are receivers (a Static has no
// Close to stop it) and until close (a Memberlist's Close).
//
// Producers call deliver, which never blocks: memberlist calls it on its
// packet goroutine, and a Static calls it for each peer it sends to.
type inbox struct {
	queue   chan envelope // capacity messageQueue
	wake    chan struct{} // capacity 1; signalled when a receiver stops
	quit    chan struct{} // closed by close
	wg      sync.WaitGroup
	dropped atomic.Uint64
	// gen is bumped by each Receive; a message carries the value deliver
	// saw, so that a receiver gets only the messages that arrived after it
	// was registered, never ones left in the queue from before.
	gen    atomic.Uint64
	active atomic.Int64 // registered receivers, so deliver can drop without locking

	mu sync.Mutex
	// receivers, in registration order. Copied on removal, so that the
	// dispatch goroutine can hold a snapshot without copying it per message.
	receivers []*receiver
	running   bool // a dispatch goroutine exists
	closed    bool
}

// envelope is one received message, copied out of the sender's buffer.
type envelope struct {
	from string
	msg  []byte
	gen  uint64
}

// receiver is one Receive registration.
type receiver struct {
	fn  func(from string, msg []byte)
	gen uint64 // the inbox's gen when it was registered

	mu      sync.Mutex // held while fn runs, so that stop can wait for it
	stopped bool
}

func newInbox() *inbox {
	return &inbox{
		queue: make(chan envelope, messageQueue),
		wake:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
	}
}

// deliver queues a copy of msg from the named sender, or drops it (and
// counts it) when nobody receives or the queue is full. It never blocks.
func (in *inbox) deliver(from string, msg []byte) {
	if in.active.Load() == 0 {
		in.dropped.Add(1)
		return
	}
	env := envelope{from: from, msg: bytes.Clone(msg), gen: in.gen.Load()}
	if env.msg == nil {
		env.msg = []byte{} // an empty message, not a missing one
	}
	select {
	case in.queue <- env:
	default:
		in.dropped.Add(1)
	}
}

// drop counts a message that was not even worth queueing.
func (in *inbox) drop() { in.dropped.Add(1) }

// receive implements Messenger.Receive. After close, fn is registered but
// never called.
func (in *inbox) receive(fn func(from string, msg []byte)) (stop func()) {
	r := &receiver{fn: fn}
	in.mu.Lock()
	r.gen = in.gen.Add(1)
	in.receivers = append(in.receivers, r)
	in.active.Add(1)
	if !in.running && !in.closed {
		in.running = true
		in.wg.Add(1)
		go in.run()
	}
	in.mu.Unlock()

	var once sync.Once
	return func() {
		once.Do(func() {
			in.mu.Lock()
			in.receivers = slices.DeleteFunc(slices.Clone(in.receivers), func(x *receiver) bool { return x == r })
			in.active.Add(-1)
			in.mu.Unlock()
			// Wait for a running fn to return, then make sure it is not
			// called again even if the dispatcher already holds r.
			r.mu.Lock()
			r.stopped = true
			r.mu.Unlock()
			// Let the dispatcher notice it may have no receiver left.
			select {
			case in.wake <- struct{}{}:
			default:
			}
		})
	}
}

// run is the dispatch loop. It returns at close, or once no receiver is
// left, dropping what is still queued.
func (in *inbox) run() {
	defer in.wg.Done()
	for {
		select {
		case env := <-in.queue:
			in.dispatch(env)
		case <-in.wake:
		case <-in.quit:
			return
		}
		in.mu.Lock()
		if len(in.receivers) == 0 {
			in.running = false
			in.mu.Unlock()
			for {
				select {
				case <-in.queue:
					in.dropped.Add(1)
				default:
					return
				}
			}
		}
		in.mu.Unlock()
	}
}

// dispatch calls every receiver registered before env arrived.
func (in *inbox) dispatch(env envelope) {
	in.mu.Lock()
	rs := in.receivers
	in.mu.Unlock()
	delivered := false
	for _, r := range rs {
		r.mu.Lock()
		if !r.stopped && env.gen >= r.gen {
			r.fn(env.from, env.msg)
			delivered = true
		}
		r.mu.Unlock()
	}
	if !delivered {
		in.dropped.Add(1)
	}
}

// close stops the dispatch goroutine, waiting for a running receiver to
// return. Receivers registered later are never called. It is idempotent.
func (in *inbox) close() {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return
	}
	in.closed = true
	in.mu.Unlock()
	close(in.quit)
	in.wg.Wait()
}
