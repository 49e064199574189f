package membership

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// message is one delivery seen by an inbox recorder.
type message struct{ from, msg string }

// inboxRecorder collects the messages a receiver is called with.
type inboxRecorder struct {
	mu  sync.Mutex
	got []message
}

func (r *inboxRecorder) fn(from string, msg []byte) {
	r.mu.Lock()
	r.got = append(r.got, message{from, string(msg)})
	r.mu.Unlock()
}

func (r *inboxRecorder) messages() []message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// waitMessages polls until r has received want, in that order, and fails
// if it received anything else.
func waitMessages(t *testing.T, r *inboxRecorder, want ...message) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprintf("%d messages arrive", len(want)), func() bool {
		return len(r.messages()) >= len(want)
	})
	if got := r.messages(); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
}

// gate blocks a receiver until opened. Open is idempotent, so that a test
// can defer it, to free a blocked receiver (and the stop waiting for it)
// when it fails early.
type gate struct {
	c    chan struct{}
	once sync.Once
}

func newGate() *gate  { return &gate{c: make(chan struct{})} }
func (g *gate) wait() { <-g.c }
func (g *gate) open() { g.once.Do(func() { close(g.c) }) }

// connected returns Statics of the given names on one new Bus.
func connected(names ...string) []*Static {
	b := NewBus()
	out := make([]*Static, len(names))
	for i, n := range names {
		out[i] = NewStatic(n, len(names))
		out[i].Connect(b)
	}
	return out
}

func TestBusBroadcast(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := connected("a", "b", "c")
	var r [3]inboxRecorder
	for i := range s {
		defer s[i].Receive(r[i].fn)()
	}
	buf := []byte("hello")
	if err := s[0].Broadcast(buf); err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXX") // the caller may reuse its buffer at once
	if err := s[1].Broadcast([]byte("from b")); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, &r[1], message{"a", "hello"})
	waitMessages(t, &r[2], message{"a", "hello"}, message{"b", "from b"})
	waitMessages(t, &r[0], message{"b", "from b"}) // never its own
}

func TestBusSend(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := connected("a", "b", "c")
	var r [3]inboxRecorder
	for i := range s {
		defer s[i].Receive(r[i].fn)()
	}
	for _, tt := range []struct {
		to   string
		want error
	}{
		{"c", nil},
		{"a", nil}, // itself: nothing happens
		{"nobody", ErrUnknownMember},
		{"b", nil},
	} {
		if err := s[0].Send(tt.to, []byte("to "+tt.to)); !errors.Is(err, tt.want) {
			t.Errorf("Send(%q) = %v, want %v", tt.to, err, tt.want)
		}
	}
	waitMessages(t, &r[2], message{"a", "to c"})
	waitMessages(t, &r[1], message{"a", "to b"})
	if got := r[0].messages(); len(got) != 0 {
		t.Errorf("a received %v from sending to itself, want nothing", got)
	}
}

// TestStaticAlone: without a Bus, a Static has nobody to tell.
func TestStaticAlone(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := NewStatic("a", 1)
	var r inboxRecorder
	stop := s.Receive(r.fn)
	defer stop()
	for _, tt := range []struct {
		name string
		send func() error
		want error
	}{
		{"broadcast", func() error { return s.Broadcast([]byte("x")) }, nil},
		{"send to itself", func() error { return s.Send("a", []byte("x")) }, nil},
		{"send to another", func() error { return s.Send("b", []byte("x")) }, ErrUnknownMember},
		{"broadcast too large", func() error { return s.Broadcast(make([]byte, MaxMessage+1)) }, ErrMessageTooLarge},
		{"send too large", func() error { return s.Send("a", make([]byte, MaxMessage+1)) }, ErrMessageTooLarge},
	} {
		if err := tt.send(); !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
		}
	}
	if got := r.messages(); len(got) != 0 {
		t.Errorf("received %v, want nothing", got)
	}
	if got := s.Dropped(); got != 0 {
		t.Errorf("Dropped() = %d, want 0", got)
	}
}

func TestBusMessageSize(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := connected("a", "b")
	var r inboxRecorder
	defer s[1].Receive(r.fn)()
	for _, tt := range []struct {
		size int
		want error
	}{
		{0, nil},
		{MaxMessage, nil},
		{MaxMessage + 1, ErrMessageTooLarge},
	} {
		msg := bytes.Repeat([]byte{'m'}, tt.size)
		if err := s[0].Broadcast(msg); !errors.Is(err, tt.want) {
			t.Errorf("Broadcast(%d bytes) = %v, want %v", tt.size, err, tt.want)
		}
		if err := s[0].Send("b", msg); !errors.Is(err, tt.want) {
			t.Errorf("Send(%d bytes) = %v, want %v", tt.size, err, tt.want)
		}
	}
	empty, full := message{"a", ""}, message{"a", strings.Repeat("m", MaxMessage)}
	waitMessages(t, &r, empty, empty, full, full)
}

// TestBusDropsWhenFull: a receiver that does not return blocks neither the
// sender nor the other receivers; what its queue cannot hold is dropped and
// counted, and the rest is delivered in order once it returns.
func TestBusDropsWhenFull(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := connected("sender", "slow", "fast")
	entered, release := make(chan struct{}), newGate()
	var slow inboxRecorder
	defer s[1].Receive(func(from string, msg []byte) {
		if string(msg) == "0" {
			close(entered)
			release.wait()
		}
		slow.fn(from, msg)
	})()
	defer release.open()
	var fast inboxRecorder
	defer s[2].Receive(fast.fn)()

	const extra = 10
	if err := s[0].Broadcast([]byte("0")); err != nil {
		t.Fatal(err)
	}
	<-entered // the slow receiver holds message 0; its queue is empty
	sent := make(chan error, 1)
	go func() {
		for i := 1; i <= messageQueue+extra; i++ {
			if err := s[0].Broadcast([]byte(fmt.Sprint(i))); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Broadcast blocked on a receiver that does not return")
	}
	if got := s[1].Dropped(); got != extra {
		t.Errorf("slow Dropped() = %d, want %d", got, extra)
	}
	// The fast receiver keeps receiving meanwhile (whatever the burst did
	// not overflow its own queue with).
	eventually(t, 5*time.Second, "the fast receiver handles the burst", func() bool {
		return uint64(len(fast.messages()))+s[2].Dropped() == messageQueue+extra+1
	})
	if err := s[0].Send("fast", []byte("ping")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the fast receiver gets a message sent after the burst", func() bool {
		m := fast.messages()
		return len(m) > 0 && m[len(m)-1] == message{"sender", "ping"}
	})

	release.open()
	want := make([]message, messageQueue+1)
	for i := range want {
		want[i] = message{"sender", fmt.Sprint(i)}
	}
	waitMessages(t, &slow, want...)
}

// TestStaticReceiveStop: messages that arrive while nobody receives, or
// before a receiver was registered, are dropped and counted; stop waits for
// a running fn and no call follows it.
func TestStaticReceiveStop(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := connected("a", "b")
	a, b := s[0], s[1]

	if err := a.Send("b", []byte("nobody listens")); err != nil {
		t.Fatal(err)
	}
	if got := b.Dropped(); got != 1 {
		t.Errorf("Dropped() = %d after a message with no receiver, want 1", got)
	}

	entered, release := make(chan struct{}), newGate()
	var mu sync.Mutex
	running := false
	var r inboxRecorder
	stop := b.Receive(func(from string, msg []byte) {
		mu.Lock()
		running = true
		mu.Unlock()
		if string(msg) == "block" {
			close(entered)
			release.wait()
		}
		r.fn(from, msg)
		mu.Lock()
		running = false
		mu.Unlock()
	})
	if err := a.Send("b", []byte("block")); err != nil {
		t.Fatal(err)
	}
	defer stop()
	defer release.open()
	<-entered
	stopped := make(chan struct{})
	go func() {
		stop()
		close(stopped)
	}()
	// stop must wait for fn, which is blocked: it cannot return until
	// release. A message queued meanwhile is never delivered.
	if err := a.Send("b", []byte("after stop")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
		t.Fatal("stop returned while fn was running")
	case <-time.After(50 * time.Millisecond):
	}
	release.open()
	<-stopped
	mu.Lock()
	if running {
		t.Error("fn still running after stop returned")
	}
	mu.Unlock()
	stop() // idempotent
	eventually(t, 5*time.Second, "the message queued during stop is dropped", func() bool { return b.Dropped() == 2 })
	if err := a.Send("b", []byte("no receiver")); err != nil {
		t.Fatal(err)
	}
	if got := b.Dropped(); got != 3 {
		t.Errorf("Dropped() = %d, want 3", got)
	}
	if got, want := r.messages(), []message{{"a", "block"}}; !slices.Equal(got, want) {
		t.Errorf("received %v, want %v", got, want)
	}

	// A new receiver gets what arrives from then on only.
	var r2 inboxRecorder
	defer b.Receive(r2.fn)()
	if err := a.Send("b", []byte("fresh")); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, &r2, message{"a", "fresh"})
}

// TestStaticReceiveOnlyNewMessages: a message that another receiver left in
// the queue is not delivered to a receiver registered after it arrived.
func TestStaticReceiveOnlyNewMessages(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	s := connected("a", "b")
	entered, release := make(chan struct{}), newGate()
	var first inboxRecorder
	defer s[1].Receive(func(from string, msg []byte) {
		if string(msg) == "1" {
			close(entered)
			release.wait()
		}
		first.fn(from, msg)
	})()
	defer release.open()
	_ = s[0].Send("b", []byte("1"))
	<-entered
	_ = s[0].Send("b", []byte("2")) // queued behind 1, before the second receiver
	var second inboxRecorder
	defer s[1].Receive(second.fn)()
	_ = s[0].Send("b", []byte("3"))
	release.open()
	waitMessages(t, &first, message{"a", "1"}, message{"a", "2"}, message{"a", "3"})
	waitMessages(t, &second, message{"a", "3"})
}

// TestBusConnect: a Static moves between Buses and leaves them; names on a
// Bus are unique.
func TestBusConnect(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	b1, b2 := NewBus(), &Bus{} // the zero Bus is ready to use
	a, b, c := NewStatic("a", 1), NewStatic("b", 1), NewStatic("c", 1)
	a.Connect(b1)
	a.Connect(b1) // again: nothing changes
	b.Connect(b1)
	c.Connect(b2)
	if err := a.Send("b", nil); err != nil {
		t.Errorf("a to b on one Bus: %v", err)
	}
	if err := a.Send("c", nil); !errors.Is(err, ErrUnknownMember) {
		t.Errorf("a to c on another Bus: err = %v, want ErrUnknownMember", err)
	}
	a.Connect(b2)
	if err := a.Send("c", nil); err != nil {
		t.Errorf("a to c after moving to c's Bus: %v", err)
	}
	if err := b.Send("a", nil); !errors.Is(err, ErrUnknownMember) {
		t.Errorf("b to a after a moved away: err = %v, want ErrUnknownMember", err)
	}
	a.Connect(nil)
	if err := c.Send("a", nil); !errors.Is(err, ErrUnknownMember) {
		t.Errorf("c to a after a left: err = %v, want ErrUnknownMember", err)
	}
	if err := a.Broadcast([]byte("x")); err != nil {
		t.Errorf("Broadcast without a Bus: %v", err)
	}

	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `"b"`) {
			t.Errorf("connecting a second Static named b: recovered %v, want a panic naming b", r)
		}
	}()
	NewStatic("b", 1).Connect(b1)
}

func TestParseFrame(t *testing.T) {
	long := strings.Repeat("n", MaxNameLength)
	for _, tt := range []struct {
		name      string
		frame     []byte
		from, msg string
		ok        bool
	}{
		{"message", appendFrame(nil, "api-1", []byte("hi")), "api-1", "hi", true},
		{"empty message", appendFrame(nil, "api-1", nil), "api-1", "", true},
		{"longest name, largest message", appendFrame(nil, long, make([]byte, MaxMessage)), long, string(make([]byte, MaxMessage)), true},
		{"empty", nil, "", "", false},
		{"other version", append([]byte{2}, appendFrame(nil, "a", nil)[1:]...), "", "", false},
		{"no name length", []byte{frameVersion}, "", "", false},
		{"empty name", []byte{frameVersion, 0, 'x'}, "", "", false},
		{"name cut short", []byte{frameVersion, 5, 'a', 'b'}, "", "", false},
		{"name too long", appendFrame(nil, long+"n", nil), "", "", false},
		{"message too large", appendFrame(nil, "a", make([]byte, MaxMessage+1)), "", "", false},
	} {
		from, msg, ok := parseFrame(tt.frame)
		if ok != tt.ok || string(from) != tt.from || string(msg) != tt.msg {
			t.Errorf("%s: parseFrame = %q, %d bytes, %v; want %q, %d bytes, %v", tt.name, from, len(msg), ok, tt.from, len(tt.msg), tt.ok)
		}
	}
}

// TestStaticMembers: a Static names the Statics on its Bus, itself
// included, sorted, and follows Connect; without a Bus it names itself.
func TestStaticMembers(t *testing.T) {
	bus := NewBus()
	self, a, b := NewStatic("c", 3), NewStatic("a", 3), NewStatic("b", 3)
	var r Roster = self
	for _, tc := range []struct {
		connect *Static
		to      *Bus
		want    []string
	}{
		{nil, nil, []string{"c"}},
		{self, bus, []string{"c"}},
		{a, bus, []string{"a", "c"}},
		{b, bus, []string{"a", "b", "c"}},
		{a, nil, []string{"b", "c"}},
		{self, nil, []string{"c"}},
	} {
		if tc.connect != nil {
			tc.connect.Connect(tc.to)
		}
		if got := r.View().Members; !slices.Equal(got, tc.want) {
			t.Errorf("View().Members = %v, want %v", got, tc.want)
		}
	}
}
