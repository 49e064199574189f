package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// TestRefusal: every outcome of a decision, including those the tests
// through a server cannot produce at will, and the answer it gets.
func TestRefusal(t *testing.T) {
	const noRetry = time.Duration(-1)
	wrap := func(err error) error { return fmt.Errorf("hybrid: limit %q: %w", "api", err) }
	for _, tc := range []struct {
		name     string
		d        hybrid.Decision
		err      error
		code     codes.Code
		retry    time.Duration // RetryInfo delay, noRetry for none
		pushback string        // "" for no trailer
	}{
		{"admitted", hybrid.Decision{Allowed: true, Remaining: 3, Source: hybrid.SourceLease}, nil, codes.OK, noRetry, ""},
		{"fail open", hybrid.Decision{Allowed: true, Source: hybrid.SourceFailOpen}, nil, codes.OK, noRetry, ""},
		{"denied", hybrid.Decision{RetryAfter: 1500 * time.Microsecond, Source: hybrid.SourceLocal}, nil, codes.ResourceExhausted, 1500 * time.Microsecond, "2"},
		{"denied by Redis", hybrid.Decision{RetryAfter: 2 * time.Second, Source: hybrid.SourceGlobal}, nil, codes.ResourceExhausted, 2 * time.Second, "2000"},
		{"denied, a day to wait", hybrid.Decision{RetryAfter: 24 * time.Hour, Source: hybrid.SourceLocal}, nil, codes.ResourceExhausted, 24 * time.Hour, "86400000"},
		{"denied, more than a day to wait", hybrid.Decision{RetryAfter: 24*time.Hour + 1, Source: hybrid.SourceLocal}, nil, codes.ResourceExhausted, noRetry, "-1"},
		{"denied for ever", hybrid.Decision{RetryAfter: hybrid.Never, Source: hybrid.SourceLocal}, nil, codes.ResourceExhausted, noRetry, "-1"},
		{"denied, no wait stated", hybrid.Decision{Source: hybrid.SourceLocal}, nil, codes.ResourceExhausted, 0, "0"},
		{"exceeds burst", hybrid.Decision{RetryAfter: hybrid.Never, Source: hybrid.SourceLease}, wrap(hybrid.ErrExceedsBurst), codes.ResourceExhausted, noRetry, "-1"},
		{"fail closed", hybrid.Decision{RetryAfter: 50 * time.Millisecond, Source: hybrid.SourceFailClosed}, nil, codes.Unavailable, 50 * time.Millisecond, "50"},
		{"closed", hybrid.Decision{}, hybrid.ErrClosed, codes.Unavailable, noRetry, ""},
		{"unknown limit", hybrid.Decision{}, wrap(hybrid.ErrUnknownLimit), codes.Internal, noRetry, ""},
		{"cost below 1", hybrid.Decision{}, wrap(hybrid.ErrInvalidN), codes.Internal, noRetry, ""},
		{"canceled", hybrid.Decision{}, wrap(context.Canceled), codes.Canceled, noRetry, ""},
		{"deadline", hybrid.Decision{}, wrap(context.DeadlineExceeded), codes.DeadlineExceeded, noRetry, ""},
		{"any other error", hybrid.Decision{}, errors.New("hybrid: something new"), codes.Unavailable, noRetry, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			trailer, err := refusal("api", 1, tc.d, tc.err)
			st := status.Convert(err)
			if st.Code() != tc.code {
				t.Errorf("code %v (%v), want %v", st.Code(), err, tc.code)
			}
			retry := noRetry
			for _, d := range st.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					retry = ri.GetRetryDelay().AsDuration()
				}
			}
			if retry != tc.retry {
				t.Errorf("RetryInfo delay %v, want %v (-1ns: none)", retry, tc.retry)
			}
			got := ""
			if v := trailer.Get(pushbackTrailer); len(v) > 0 {
				got = v[0]
			}
			if got != tc.pushback {
				t.Errorf("pushback %q, want %q", got, tc.pushback)
			}
		})
	}
}

func TestEmptyKeyString(t *testing.T) {
	for e, want := range map[EmptyKey]string{
		EmptyKeyShared: "shared",
		EmptyKeyReject: "reject",
		EmptyKeySkip:   "skip",
		EmptyKey(9):    "EmptyKey(9)",
	} {
		if got := e.String(); got != want {
			t.Errorf("EmptyKey(%d).String() = %q, want %q", int(e), got, want)
		}
	}
}
