package membership

import (
	"bytes"
	"crypto/rand"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// cluster3 starts three Local nodes n1, n2 and n3 that count each other,
// each with a recorder receiving its messages until the end of the test.
func cluster3(t *testing.T, mod func(*Config)) ([]*Memberlist, []*inboxRecorder) {
	t.Helper()
	n1 := startNode(t, "n1", mod)
	n2 := startNode(t, "n2", mod, n1.Addr())
	n3 := startNode(t, "n3", mod, n1.Addr())
	ns := []*Memberlist{n1, n2, n3}
	waitCount(t, 5*time.Second, 3, ns...)
	rs := make([]*inboxRecorder, len(ns))
	for i, n := range ns {
		rs[i] = new(inboxRecorder)
		t.Cleanup(n.Receive(rs[i].fn)) // runs before the node's Close
	}
	return ns, rs
}

func TestMemberlistBroadcast(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n, r := cluster3(t, nil)
	buf := []byte("hello")
	if err := n[0].Broadcast(buf); err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXX") // the caller may reuse its buffer at once
	waitMessages(t, r[1], message{"n1", "hello"})
	waitMessages(t, r[2], message{"n1", "hello"})

	if err := n[1].Broadcast([]byte("from n2")); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, r[2], message{"n1", "hello"}, message{"n2", "from n2"})
	// n1 hears n2, and never itself.
	waitMessages(t, r[0], message{"n2", "from n2"})
	for _, m := range n {
		if got := m.Dropped(); got != 0 {
			t.Errorf("%s: Dropped() = %d, want 0", m.Name(), got)
		}
	}
}

func TestMemberlistSend(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n, r := cluster3(t, nil)
	for _, tt := range []struct {
		to   string
		want error
	}{
		{"n3", nil},
		{"n1", nil}, // itself: nothing happens
		{"n4", ErrUnknownMember},
		{"n2", nil},
	} {
		if err := n[0].Send(tt.to, []byte("to "+tt.to)); !errors.Is(err, tt.want) {
			t.Errorf("Send(%q) = %v, want %v", tt.to, err, tt.want)
		}
	}
	waitMessages(t, r[2], message{"n1", "to n3"})
	waitMessages(t, r[1], message{"n1", "to n2"})
	// n1 answers n3, so that n1's receiver has something to wait for.
	if err := n[2].Send("n1", []byte("answer")); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, r[0], message{"n3", "answer"})
}

// sizeTransport is a memberlist.NetTransport on 127.0.0.1, port 0, that
// records the largest packet it sends.
type sizeTransport struct {
	*memberlist.NetTransport
	largest atomic.Int64
}

func (s *sizeTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	for {
		old := s.largest.Load()
		if int64(len(b)) <= old || s.largest.CompareAndSwap(old, int64(len(b))) {
			break
		}
	}
	return s.NetTransport.WriteToAddress(b, a)
}

// TestMemberlistMessageSize: a message of MaxMessage bytes that does not
// compress, from a node with the longest name, encrypted, fits the packet
// size memberlist keeps to (its UDPBufferSize) and arrives whole; a larger
// one is refused.
func TestMemberlistMessageSize(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	key := bytes.Repeat([]byte{7}, 32)
	long := strings.Repeat("n", MaxNameLength)
	tr := &sizeTransport{NetTransport: newCountingTransport(t).NetTransport}
	a := startNode(t, long, func(c *Config) { c.SecretKey, c.Transport = key, tr })
	b := startNode(t, "b", func(c *Config) { c.SecretKey = key }, a.Addr())
	waitCount(t, 5*time.Second, 2, a, b)
	var r inboxRecorder
	defer b.Receive(r.fn)()

	msg := make([]byte, MaxMessage)
	_, _ = rand.Read(msg)
	if err := a.Broadcast(msg); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, &r, message{long, string(msg)})
	udp := memberlist.DefaultLocalConfig().UDPBufferSize
	if got := tr.largest.Load(); got > int64(udp) {
		t.Errorf("largest packet sent: %d bytes, want at most %d", got, udp)
	} else {
		t.Logf("largest packet sent: %d bytes of %d", got, udp)
	}

	tooLarge := make([]byte, MaxMessage+1)
	if err := a.Broadcast(tooLarge); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("Broadcast(%d bytes) = %v, want ErrMessageTooLarge", len(tooLarge), err)
	}
	if err := a.Send("b", tooLarge); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("Send(%d bytes) = %v, want ErrMessageTooLarge", len(tooLarge), err)
	}
	if _, err := Join(Config{Name: long + "n", BindAddr: "127.0.0.1"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Join with a name of %d bytes: err = %v, want ErrInvalidConfig", len(long)+1, err)
	}
}

// TestMemberlistReceiveStop: once stop returns, messages are no longer
// delivered but dropped and counted, as are malformed ones and ones that
// claim to come from the receiving node itself.
func TestMemberlistReceiveStop(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	waitCount(t, 5*time.Second, 2, n1, n2)
	var r inboxRecorder
	stop := n2.Receive(r.fn)
	defer stop()
	if err := n1.Send("n2", []byte("before")); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, &r, message{"n1", "before"})

	var to *memberlist.Node
	for _, m := range n1.ml.Members() {
		if m.Name == "n2" {
			to = m
		}
	}
	for _, frame := range [][]byte{
		{frameVersion + 1, 1, 'x'},                // another version
		appendFrame(nil, "n2", []byte("spoofed")), // n2's own name
	} {
		if err := n1.ml.SendBestEffort(to, frame); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "n2 drops the malformed and the spoofed message", func() bool { return n2.Dropped() == 2 })

	stop()
	if err := n1.Send("n2", []byte("after")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "n2 drops the message that came after stop", func() bool { return n2.Dropped() == 3 })
	if got, want := r.messages(), []message{{"n1", "before"}}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("received %v, want %v", got, want)
	}
}

// TestMemberlistMessagesAfterClose: Close stops the receivers' goroutine
// even while a receiver is registered (verifyNoLeaks checks), and the node
// then refuses to send.
func TestMemberlistMessagesAfterClose(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	waitCount(t, 5*time.Second, 2, n1, n2)
	var r inboxRecorder
	n2.Receive(r.fn) // never stopped
	if err := n1.Broadcast([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, &r, message{"n1", "hi"})

	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n2.Broadcast([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("Broadcast after Close: err = %v, want ErrClosed", err)
	}
	if err := n2.Send("n1", []byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("Send after Close: err = %v, want ErrClosed", err)
	}
	n2.Receive(func(string, []byte) { t.Error("receiver called after Close") })()
}

// TestMemberlistSendWhileMetadataChanges: messages go to copies of the
// members' addresses, so a send never reads a memberlist node that
// memberlist rewrites when a member's metadata changes (under -race, a
// send to memberlist's own *Node was reported racing with that update).
func TestMemberlistSendWhileMetadataChanges(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n, r := cluster3(t, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			_ = n[0].Broadcast([]byte{byte(i)})
			_ = n[0].Send("n2", []byte{byte(i)})
		}
	}()
	for i := range 20 {
		n[1].leaving.Store(i%2 == 0) // its metadata says so, or not
		if err := n[1].ml.UpdateNode(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if err := n[0].Broadcast([]byte("last")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "n3 hears the last broadcast", func() bool {
		return slices.Contains(r[2].messages(), message{"n1", "last"})
	})
}
